"""The market's settings (settings.MARKET, environment MARKET_*, docs/deployment.md) and the price rules they
configure. Read on every call, so a test or an operator's override takes effect without a restart."""
from __future__ import annotations

from django.conf import settings

from scheduler.core.pricing import PriceRules


def market(name: str):
    return settings.MARKET[name]


def price_rules() -> PriceRules:
    """DESIGN §5's factors as configured (scheduler.core.pricing is the one rule that applies them)."""
    m = settings.MARKET
    return PriceRules(on_demand=m["ON_DEMAND_FACTOR"], reserved=m["RESERVED_FACTOR"],
                      reserved_short_notice=m["RESERVED_SHORT_NOTICE_FACTOR"], spot_min=m["SPOT_MIN_FACTOR"],
                      spot_max=m["SPOT_MAX_FACTOR"], resale_cap=m["RESALE_CAP"])
