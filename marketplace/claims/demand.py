"""The demand the market has seen, as the engine's learnt demand mix (scheduler.core.fragmentation.DemandMix).

The engine weighs packing by the requests it expects: the profile each would take on each MIG model (Δfrag),
the gangs of k GPUs on one node per model (the node term, and the keep charge that sends single whole-GPU
requests to GPUs no gang can use so the 8-GPU nodes stay whole), and the share pinned to model lists (the pin
charge). The simulator's engine learns that mix request by request (`Scheduler.place`); the market decides on
a pool built afresh for every placement, so it learns it here: the requests of the last DEMAND_MIX_ORDERS
orders placed through the engine (resale purchases are not), created within DEMAND_MIX_DAYS, whatever became of
them — an order refused for want of capacity is demand too. Each order for several GPUs also tells the mix how
long it waited (`gang_wait`; one refused only for its price, region or software tells nothing), which the keep
charge follows (fragmentation.KEEP_RISE): where gangs get their
nodes at once, singles may take MIG GPUs whole; once they wait, singles are kept off. The mix is rebuilt at
most every DEMAND_MIX_TTL_SECONDS and shared, read only, by every snapshot built meanwhile (nothing in the
market observes into a pool's mix). DEMAND_MIX_ORDERS = 0 leaves the engine its prior alone, as before.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from django.utils import timezone

from marketplace.conf import market
from marketplace.models import Mode, Order
from scheduler.core.fragmentation import DemandMix

from .holds import request_for
from .refusals import refusal_group

# the fields request_for reads: the rest of an order is not loaded
_FIELDS = ("mode", "gpu_models", "memory_gb", "compute_slices", "whole_gpu", "gpu_count", "min_cuda",
           "min_compute_capability", "regions", "buyer_region", "max_price_per_hour", "priority", "window_start",
           "created_at", "placed_at", "attempts", "reasons")

_lock = threading.Lock()
_learnt: tuple[float, DemandMix] | None = None


def demand_mix_build(*, now: datetime | None = None) -> DemandMix:
    """A demand mix of the recent orders' requests (see the module docstring), snapshotted."""
    now = now or timezone.now()
    mix = DemandMix()
    limit = market("DEMAND_MIX_ORDERS")
    if limit:
        since = now - timedelta(days=market("DEMAND_MIX_DAYS"))
        orders = list(Order.objects.filter(created_at__gte=since).exclude(mode=Mode.RESALE)
                      .order_by("-created_at").only(*_FIELDS)[:limit])
        for order in reversed(orders):  # oldest first: the keep factor follows the gangs' waits in turn
            mix.observe(request_for(order, now=now, image=""))  # the shape only: no workload image lookup
            waited = gang_wait(order, now=now) if order.gpu_count > 1 else None
            if waited is not None:
                mix.gang_started(waited)
    mix.refresh()
    return mix


def gang_wait(order: Order, *, now: datetime) -> float | None:
    """Seconds a request for several GPUs waited for its GPUs, as the keep charge reads it
    (DemandMix.gang_started): 0 when placed at its first attempt, else until it was placed, or until now for
    one still queued, refused or cancelled before it started. None when it was not placed and the refusals it
    recorded name no GPU taken (claims/refusals.py, group "taken": busy GPUs, no room for the slice, fewer than k
    free on a node) — priced above its cap, offline or too old a CUDA says nothing about whether gangs find
    their nodes, so it neither raises the keep charge nor eases it."""
    if order.placed_at is not None and order.attempts <= 1:
        return 0.0
    if order.placed_at is None and order.reasons and not any(refusal_group(r) == "taken" for r in order.reasons):
        return None
    return max(0.0, ((order.placed_at or now) - order.created_at).total_seconds())


def learnt_mix() -> DemandMix:
    """The market's demand mix, at most DEMAND_MIX_TTL_SECONDS old (a TTL of 0 builds one for every call)."""
    global _learnt
    ttl = market("DEMAND_MIX_TTL_SECONDS")
    with _lock:
        if _learnt is None or ttl <= 0 or time.monotonic() - _learnt[0] > ttl:
            _learnt = (time.monotonic(), demand_mix_build())
        return _learnt[1]


def forget() -> None:
    """Drop the cached mix (tests; the next snapshot learns it again)."""
    global _learnt
    with _lock:
        _learnt = None
