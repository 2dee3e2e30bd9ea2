"""Spot: a price per GPU model between SPOT_MIN_FACTOR and SPOT_MAX_FACTOR of base (50%..70%) that follows
the free share of that model's pool, kept as history; running spot leases repriced with it and interrupted
(lifecycle.lease_interrupt, with notice) when the price passes their bid. Bids are capped at the on-demand
price of the most expensive unit that could serve the order.
"""
from __future__ import annotations

import statistics
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from marketplace.claims import snapshot
from marketplace.lifecycle.leases import lease_interrupt, lease_reprice
from marketplace.models import Interruption, Lease, Mode, SpotPrice
from marketplace.pricing import price_for, spot_factor_at
from nodeagent.hardware.mig import MigGeometry, smallest_fitting_profile
from scheduler.core.model import Request
from scheduler.models import Gpu


def bid_cap(*, request: Request) -> Decimal | None:
    """The highest on-demand price of any unit in the catalog that could serve `request` (a bid above it is
    pointless): every registered node's present GPUs of the allowed models and regions, online or not, so an
    order that queues because nothing is free (or nothing is online) is capped like one placed at once.
    None when no GPU anywhere could serve it."""
    gpus = Gpu.objects.filter(present=True, gpu_model__isnull=False)
    if request.models is not None:
        gpus = gpus.filter(gpu_model__key__in=list(request.models))
    if request.regions is not None:
        gpus = gpus.filter(node__region__in=list(request.regions))
    best = None
    # One row per distinct (price, model, MIG layout): a fleet of identical GPUs is priced once.
    for price, memory_gb, mig_enabled, geometry_dict in (
            gpus.values_list("node__price_per_gpu_hour", "gpu_model__memory_gb", "mig_enabled", "mig_geometry")
            .distinct()):
        geometry = MigGeometry.from_dict(geometry_dict) if mig_enabled and geometry_dict else None
        if request.wants_whole or geometry is None:
            if float(memory_gb) + 1e-9 < request.memory_gb:
                continue
            profile = None
        else:
            fit = smallest_fitting_profile(geometry, memory_gb=request.memory_gb,
                                           compute_slices=request.compute_slices)
            if fit is None:
                continue
            profile = fit.name
        od = price_for(mode="on_demand", base_per_gpu_hour=price, geometry=geometry, profile=profile)
        best = od if best is None else max(best, od)
    return best


def spot_prices_recompute(*, now: datetime | None = None) -> int:
    """Beat: record each model's spot price from its pool's free share, then reprice running spot leases,
    interrupting those whose new price passes their bid. Returns the number of models priced."""
    now = now or timezone.now()
    pool = snapshot.cached().pool
    factors: dict[str, Decimal] = {}
    rows = []
    for model, recs in pool.by_model.items():
        free = pool.free_share(model)
        factor = factors[model] = spot_factor_at(free_share=free)
        base = Decimal(str(statistics.median(r.node.price_per_gpu_hour for r in recs)))
        rows.append(SpotPrice(gpu_model=model, at=now, factor=factor, free_share=free,
                              price_per_gpu_hour=price_for(mode="spot", base_per_gpu_hour=base, geometry=None,
                                                           profile=None, spot_factor=factor)))
    SpotPrice.objects.bulk_create(rows)
    for lease in (Lease.objects.filter(mode=Mode.SPOT, state__in=[Lease.State.RUNNING, Lease.State.PROVISIONING])
                  .select_related("slice__gpu__node", "slice__gpu__gpu_model", "order")):
        gpu = lease.slice.gpu
        factor = factors.get(gpu.gpu_model.key if gpu.gpu_model else "")
        if factor is None:
            continue
        new = price_for(mode="spot", base_per_gpu_hour=gpu.node.price_per_gpu_hour, geometry=gpu.geometry(),
                        profile=lease.slice.profile or None, spot_factor=factor)
        # A k-GPU order's bid (each lease's bid_per_hour) is for its k GPUs together, k alike on one node.
        k = lease.order.gpu_count if lease.order is not None else 1
        if lease.bid_per_hour is not None and new * k > lease.bid_per_hour:
            lease_interrupt(lease_id=lease.pk, kind=Interruption.Kind.PRICE, now=now)
        elif new != lease.price_per_hour:
            lease_reprice(lease_id=lease.pk, price=new, now=now)
    return len(rows)
