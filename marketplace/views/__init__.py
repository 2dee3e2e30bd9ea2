"""Console pages, by domain. Thin: parse input, call a selector or service, render."""
from .account import account, api_key_create, api_key_revoke, notifications_save, project_create, project_delete  # noqa: F401,E501
from .billing import balance_fragment, billing, statement_csv, topup  # noqa: F401
from .catalog import catalog, unit_detail  # noqa: F401
from .fleet import gpu_health, home, node_detail, node_drain, node_gpus_fragment, node_register, nodes  # noqa: F401
from .leases import lease_detail, lease_end, lease_facts, leases, order_cancel  # noqa: F401
from .orders import order, order_preview  # noqa: F401
from .resale import list_for_resale, listing_cancel, resale_buy, resale_market, reservations  # noqa: F401
