"""GPU Market command line: `gpum` (or `python -m gpumarket`) finds offers, orders, watches and ends leases, and
shows money, for people (tables) and scripts (`--json`).

Standalone: the standard library and `websockets` only; it imports nothing from the web application (a test
enforces it) and ships as its own wheel (`make cli-wheel`). docs/cli.md is its manual.
"""
__version__ = "0.1.0"
