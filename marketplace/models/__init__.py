"""Market models, split by domain: accounts (API keys), billing (money), market (orders, leases, ...)."""
from .accounts import ApiKey

__all__ = ["ApiKey"]
