"""GPU Market command line (gpum): offers, orders, leases, ssh, logs, metrics, resale and money from a terminal.

`gpum` (or `python -m gpumarket`) prints tables for people and the API's JSON for scripts (`--json`).

Standalone: the standard library and `websockets` only; it imports nothing from the web application (a test
enforces it) and ships as its own wheel (`make cli-wheel`). docs/cli.md is its manual.
"""
__version__ = "0.1.0"
