"""The market's prices: `price_for` is the one price of a slice in every mode, for the catalog, the order
preview, placement, spot repricing and the resale cap. It applies scheduler.core.pricing's rule (the same
one the engine's price filter and scorer apply) with the factors configured in settings.MARKET.

Spot moves per GPU model: every SPOT_PRICE_SECONDS the beat records the factor the model's free share gives
(`SpotPrice`, products/spot.py); a spot lease is priced, and a spot order placed, at the latest recorded
factor (the cheapest one before any history exists).
"""
from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import OuterRef, Subquery

from marketplace.conf import market, price_rules
from marketplace.models import SpotPrice
from scheduler.core import pricing
from nodeagent.hardware.mig import MigGeometry

from .amounts import micro


def share_of(geometry: MigGeometry | None, profile: str | None) -> Decimal:
    """The share of one GPU a slice takes (1 for a whole GPU)."""
    return pricing.share_decimal(geometry=geometry, profile=profile or None)


def reserved_mode(*, starts_at: datetime, now: datetime) -> str:
    """A window booked at least RESERVED_AHEAD_SECONDS ahead gets the reserved price, else short notice."""
    ahead = (starts_at - now).total_seconds() >= market("RESERVED_AHEAD_SECONDS")
    return "reserved" if ahead else "reserved_short_notice"


def price_for(*, mode: str, base_per_gpu_hour: Decimal, geometry: MigGeometry | None, profile: str | None,
              spot_factor: Decimal | None = None) -> Decimal:
    """Per hour, to the micro-dollar: base × share × the factor of `mode` (pricing.MODES). Spot needs the
    model's `spot_factor` (spot_factors())."""
    if mode == "spot" and spot_factor is None:
        raise ValueError("a spot price needs the model's spot factor")
    return pricing.unit_price(base_per_gpu_hour=Decimal(base_per_gpu_hour), share=share_of(geometry, profile),
                              mode=mode, rules=price_rules(), spot_factor=spot_factor)


def resale_cap(*, base_per_gpu_hour: Decimal, geometry: MigGeometry | None, profile: str | None) -> Decimal:
    """The highest ask for a resold window of this slice, per hour: RESALE_CAP × base × share."""
    return micro(Decimal(base_per_gpu_hour) * share_of(geometry, profile) * price_rules().resale_cap)


def spot_factor_at(*, free_share: float) -> Decimal:
    """The spot factor a model's free share gives now (recorded by the beat)."""
    return price_rules().spot_factor(free_share=free_share)


def spot_factors(models=None) -> dict[str, Decimal]:
    """The latest recorded spot factor of each model (one query); a model without history is absent."""
    latest = SpotPrice.objects.filter(gpu_model=OuterRef("gpu_model")).order_by("-at").values("at")[:1]
    qs = SpotPrice.objects.filter(at=Subquery(latest))
    if models is not None:
        qs = qs.filter(gpu_model__in=list(models))
    return dict(qs.values_list("gpu_model", "factor"))


def spot_factor_for(*, model: str, known: dict[str, Decimal] | None = None) -> Decimal:
    """`model`'s latest recorded spot factor; before any history, the cheapest (the pool all free)."""
    factors = spot_factors([model]) if known is None else known
    found = factors.get(model)
    return found if found is not None else spot_factor_at(free_share=1.0)
