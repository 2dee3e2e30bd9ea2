"""Console pages, by domain. Thin: parse input, call a selector or service, render."""
from .account import account, api_key_create, api_key_revoke, project_create, project_delete  # noqa: F401
from .fleet import gpu_health, home, node_detail, node_drain, node_gpus_fragment, node_register, nodes  # noqa: F401
