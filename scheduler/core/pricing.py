"""Slice prices from a node's base price (DESIGN §5), as pure functions the filters and scorers share.

base = the provider's committed price for one whole GPU-hour; a slice costs base × its share of the GPU.
The share of a MIG profile is the larger of its compute share and its memory share, because either one
is capacity nobody else can use (a 3g.40gb holds 3/7 of compute but 4/8 of memory: it costs 1/2).
"""
from __future__ import annotations

from .mig import MigGeometry

ON_DEMAND_FACTOR = 1.8
RESERVED_FACTOR = 0.85  # booked at least an hour ahead; the core assumes it, the booking service checks it
SPOT_MIN_SHARE, SPOT_MAX_SHARE = 0.50, 0.70  # spot price band, as a share of the on-demand price


def slice_share(*, geometry: MigGeometry | None, profile: str | None) -> float:
    """Share of one GPU a slice takes (1.0 for a whole GPU)."""
    if geometry is None or profile is None:
        return 1.0
    p = geometry.profile(profile)
    return max(p.compute_slices / geometry.compute_slices, p.memory_slices / geometry.memory_slices)


def spot_factor(*, free_share: float) -> float:
    """Spot price as a share of on-demand: 50% when the model's pool is all free, 70% when it is full."""
    free = min(1.0, max(0.0, free_share))
    return SPOT_MIN_SHARE + (SPOT_MAX_SHARE - SPOT_MIN_SHARE) * (1.0 - free)


def mode_factor(*, mode: str, free_share: float = 1.0) -> float:
    """Multiplier on base × share for a price class."""
    if mode == "on_demand":
        return ON_DEMAND_FACTOR
    if mode == "reserved":
        return RESERVED_FACTOR
    if mode == "spot":
        return ON_DEMAND_FACTOR * spot_factor(free_share=free_share)
    raise ValueError(f"unknown price class {mode!r}")


def slice_price(*, base_per_gpu_hour: float, share: float, mode: str, free_share: float = 1.0) -> float:
    """What the buyer pays per hour for a slice of `share` of a GPU in `mode`."""
    return base_per_gpu_hour * share * mode_factor(mode=mode, free_share=free_share)
