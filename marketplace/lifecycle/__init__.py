"""The lease lifecycle (leases.py) and the port through which fleet facts reach it (port.py)."""
