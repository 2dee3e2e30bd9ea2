"""The market's settings (settings.MARKET, environment MARKET_*, docs/deployment.md), the price rules they
configure and the Stripe SDK's configuration (top-ups and payouts share it). Read on every call, so a test or an
operator's override takes effect without a restart."""
from __future__ import annotations

import stripe
from django.conf import settings

from scheduler.core.pricing import PriceRules
from scheduler.errors import DomainError


def market(name: str):
    return settings.MARKET[name]


def price_rules() -> PriceRules:
    """DESIGN §5's factors as configured (scheduler.core.pricing is the one rule that applies them)."""
    m = settings.MARKET
    return PriceRules(on_demand=m["ON_DEMAND_FACTOR"], reserved=m["RESERVED_FACTOR"],
                      reserved_short_notice=m["RESERVED_SHORT_NOTICE_FACTOR"], spot_min=m["SPOT_MIN_FACTOR"],
                      spot_max=m["SPOT_MAX_FACTOR"], resale_cap=m["RESALE_CAP"])


class PaymentsUnavailable(DomainError):
    status = 503

    def __init__(self, message: str = "Payments are not configured (STRIPE_SECRET_KEY is not set).", **kw):
        super().__init__(message, code=kw.pop("code", "payments_unavailable"), **kw)


def stripe_configure() -> None:
    """Point the Stripe SDK at the configured key and API (a local fake Stripe in the demo and tests)."""
    if not settings.STRIPE_SECRET_KEY:
        raise PaymentsUnavailable()
    stripe.api_key = settings.STRIPE_SECRET_KEY
    stripe.api_base = settings.STRIPE_API_BASE or "https://api.stripe.com"
