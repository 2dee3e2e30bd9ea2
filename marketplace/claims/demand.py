"""The demand the market has seen, as the engine's learnt demand mix (scheduler.core.fragmentation.DemandMix).

The engine weighs packing by the requests it expects: the profile each would take on each MIG model (Δfrag),
the gangs of k GPUs on one node per model (the node term, and the keep charge that sends single whole-GPU
requests to GPUs no gang can use so the 8-GPU nodes stay whole), and the share pinned to model lists (the pin
charge). The simulator's engine learns that mix request by request (`Scheduler.place`); the market decides on
a pool built afresh for every placement, so it learns it here: the requests of the last DEMAND_MIX_ORDERS
orders placed through the engine (resale purchases are not), created within DEMAND_MIX_DAYS, whatever became of
them — an order refused for want of capacity is demand too. The mix is rebuilt at most every
DEMAND_MIX_TTL_SECONDS and shared, read only, by every snapshot built meanwhile (nothing in the market observes
into a pool's mix). DEMAND_MIX_ORDERS = 0 leaves the engine its prior alone, as before this module.
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

# the fields request_for reads: the rest of an order is not loaded
_FIELDS = ("mode", "gpu_models", "memory_gb", "compute_slices", "whole_gpu", "gpu_count", "min_cuda",
           "min_compute_capability", "regions", "buyer_region", "max_price_per_hour", "priority", "window_start")

_lock = threading.Lock()
_learnt: tuple[float, DemandMix] | None = None


def demand_mix_build(*, now: datetime | None = None) -> DemandMix:
    """A demand mix of the recent orders' requests (see the module docstring), snapshotted."""
    now = now or timezone.now()
    mix = DemandMix()
    limit = market("DEMAND_MIX_ORDERS")
    if limit:
        since = now - timedelta(days=market("DEMAND_MIX_DAYS"))
        orders = (Order.objects.filter(created_at__gte=since).exclude(mode=Mode.RESALE)
                  .order_by("-created_at").only(*_FIELDS)[:limit])
        for order in orders:
            mix.observe(request_for(order, now=now, image=""))  # the shape only: no workload image lookup
    mix.refresh()
    return mix


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
