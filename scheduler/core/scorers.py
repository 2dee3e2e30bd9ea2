"""Score plugins: soft preferences. Each gives a raw value for an option and maps it to 0..100 (higher is
better) with a fixed, documented curve, so a score means the same thing whichever candidates are beside it
(the fast path and the exhaustive reference can then be compared, and a buyer can read a breakdown alone).
The scheduler multiplies each 0..100 score by its weight share (weights.py) and keeps the products.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .model import Request
from .regions import rtt_ms

if TYPE_CHECKING:
    from .placement import Option

PRICE_REF_PER_PU_HOUR = 0.30  # $ per PU-hour that scores 50 (an A100-80GB at $2 base on demand is 0.36)
LATENCY_ZERO_MS = 250.0  # RTT that scores 0
PACKING_NEUTRAL = 0.5  # Δfrag (share of a GPU) of 0 scores 50; −0.5 or better 100; +0.5 or worse 0
RELIABILITY_FLOOR = 0.80  # reliability that scores 0; 1.0 scores 100
DEGRADED_RELIABILITY = 0.8  # a degraded GPU counts as this share of its node's reliability
INTERRUPTION_HALF_RATE = 0.2  # spot interruptions per hour that score 50


def _clamp(x: float) -> float:
    return 0.0 if x < 0.0 else 100.0 if x > 100.0 else x


class Scorer:
    name: str = "scorer"

    def raw(self, option: "Option", request: Request) -> float:
        raise NotImplementedError

    def normalise(self, raw: float) -> float:
        raise NotImplementedError

    def score(self, option: "Option", request: Request) -> float:
        return self.normalise(self.raw(option, request))


class PriceScorer(Scorer):
    """Cheaper per performance unit is better: raw = $ per PU-hour in the request's class."""

    name = "price"

    def raw(self, option, request):
        return option.price_per_hour / option.pu if option.pu > 0 else float("inf")

    def normalise(self, raw):
        return _clamp(100.0 * PRICE_REF_PER_PU_HOUR / (PRICE_REF_PER_PU_HOUR + raw))


class LatencyScorer(Scorer):
    """Closer to the buyer is better: raw = RTT in ms between the buyer's region and the node's."""

    name = "latency"

    def raw(self, option, request):
        return rtt_ms(request.buyer_region, option.node.region)

    def normalise(self, raw):
        return _clamp(100.0 * (1.0 - raw / LATENCY_ZERO_MS))


class PackingScorer(Scorer):
    """Leaves the pool most usable: raw = the option's packing cost (Δfrag plus penalties, placement.py)."""

    name = "packing"

    def raw(self, option, request):
        return option.pack_cost

    def normalise(self, raw):
        return _clamp(100.0 * (PACKING_NEUTRAL - raw))


class ReliabilityScorer(Scorer):
    """More reliable is better: raw = the reliability score (core/reliability.py) of the option's least reliable
    GPU where the GPUs have their own, else its node's; a degraded GPU counts for less."""

    name = "reliability"

    def raw(self, option, request):
        own = [g.reliability for g in option.gpus if g.reliability is not None]
        r = min(own) if own else option.node.reliability
        if any(g.health == "degraded" for g in option.gpus):
            r *= DEGRADED_RELIABILITY
        return r

    def normalise(self, raw):
        return _clamp(100.0 * (raw - RELIABILITY_FLOOR) / (1.0 - RELIABILITY_FLOOR))


class InterruptionScorer(Scorer):
    """For spot: nodes that interrupted spot leases less often are better. Other classes are never
    interrupted, so every option scores 100 for them (the term then ranks nothing)."""

    name = "interruption"

    def raw(self, option, request):
        return option.node.interruption_rate if request.mode == "spot" else 0.0

    def normalise(self, raw):
        return _clamp(100.0 * INTERRUPTION_HALF_RATE / (INTERRUPTION_HALF_RATE + max(0.0, raw)))


DEFAULT_SCORERS: tuple[Scorer, ...] = (
    PriceScorer(), LatencyScorer(), PackingScorer(), ReliabilityScorer(), InterruptionScorer(),
)
