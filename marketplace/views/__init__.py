"""Console pages, by domain. Thin: parse input, call a selector or service, render."""
from .account import (account, api_key_create, api_key_revoke, notifications_save, project_create,  # noqa: F401
                      project_delete, project_detail, ssh_key_add, ssh_key_delete, two_factor)
from .alerts import alert_list, alert_rule_delete, alert_rules  # noqa: F401
from .billing import (auto_topup_card, auto_topup_card_done, auto_topup_save, balance_fragment, billing,  # noqa: F401
                      statement_csv, topup)
from .catalog import catalog, unit_detail  # noqa: F401
from .earnings import (earnings, payout_account_connect, payout_account_refresh, payout_account_return,  # noqa: F401
                       payout_cancel, payout_request)
from .fleet import (gpu_health, home, node_delete, node_detail, node_drain, node_gpus_fragment,  # noqa: F401
                    node_register, node_rename, node_settings, nodes)
from .leases import (jobs, lease_detail, lease_end, lease_facts, lease_logs, lease_report_failure, leases,  # noqa: F401
                     order_cancel)
from .operations import (autoscale_rule, autoscale_rule_delete, operations, reclaim_policy_delete,  # noqa: F401
                         reclaim_policy_save)
from .orders import order, order_preview  # noqa: F401
from .provider import provider  # noqa: F401
from .tco import tco  # noqa: F401
from .resale import (list_for_resale, listing_cancel, resale_buy, resale_market, reservation_cancel,  # noqa: F401
                     reservations)
