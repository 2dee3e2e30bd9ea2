"""GPU Market node agent: reports a server's GPUs, carves MIG instances on command, streams metrics.

Standalone: imports nothing from the web application (a test enforces it). Run `python -m nodeagent`.
"""
__version__ = "0.1.0"
