"""Scorer weights as data, and the one pure rule that moves them with the pool's load (DESIGN §6.3).

Rule (piecewise linear, so a small change in load never flips a decision wholesale):
- price: ×1 while the free share is at least 30%, rising linearly to ×1.5 at 10% free and staying there —
  a scarce pool should go to whoever the cheap capacity suits, centred on the brief's "free share < 20%";
- packing: ×1 up to 50% load (load = 1 - free share), rising linearly to ×2 at 100% load — when the pool
  fills, fragmentation decides whether the next large request fits at all.
Other weights are unchanged. The scheduler divides by the sum, so only ratios matter.

And with the demand mix the engine learns (fragmentation.DemandMix.shape_shares, refreshed with the mix):
- packing: × (1 + MIX_GAIN × exposure), exposure = the share of requests that ask for a slice of one GPU
  plus the share that ask for several GPUs on one node — the requests whose fate depends on how the pool was
  packed (a single whole GPU fits any free GPU). A pool serving only whole single GPUs keeps the base weights;
  one serving slices and gangs weighs packing up to 1 + MIX_GAIN times as much. MIX_GAIN was tuned on the
  variants listed in scheduler/sim/generalise.py (TUNE_ON) and is judged on others (REPORT_ON).
"""
from __future__ import annotations

from typing import Iterator, Mapping

PLUGINS = ("price", "latency", "packing", "reliability", "interruption")


class Weights(Mapping[str, float]):
    """Immutable plugin -> weight mapping. Missing plugins weigh 0."""

    __slots__ = ("_w",)

    def __init__(self, weights: Mapping[str, float] | None = None, /, **kw: float) -> None:
        merged = {**(weights or {}), **kw}
        for name, w in merged.items():
            if w < 0:
                raise ValueError(f"weight of {name!r} is {w}; weights are >= 0")
        self._w = dict(merged)

    def __getitem__(self, name: str) -> float:
        return self._w[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._w)

    def __len__(self) -> int:
        return len(self._w)

    def get(self, name: str, default: float = 0.0) -> float:  # type: ignore[override]
        return self._w.get(name, default)

    def scaled(self, **factors: float) -> "Weights":
        return Weights({k: v * factors.get(k, 1.0) for k, v in self._w.items()})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._w.items())))

    def __repr__(self) -> str:
        return f"Weights({self._w!r})"


DEFAULT_WEIGHTS = Weights(price=0.30, latency=0.15, packing=0.30, reliability=0.15, interruption=0.10)


def _ramp(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
    """Linear from (x0, y0) to (x1, y1), flat outside."""
    if x <= x0:
        return y0
    if x >= x1:
        return y1
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def price_factor(*, free_share: float) -> float:
    return _ramp(1.0 - free_share, 0.70, 0.90, 1.0, 1.5)


def packing_factor(*, load: float) -> float:
    return _ramp(load, 0.50, 1.00, 1.0, 2.0)


MIX_GAIN = 1.0  # tuned on TUNE_ON (python -m scheduler.sim.generalise --tune --limit 4000): 1 of 1, 2, 4


def mix_factor(*, slices: float, multi: float, gain: float = MIX_GAIN) -> float:
    """Packing multiplier for a demand mix with these shares of slice and multi-GPU requests."""
    exposure = min(1.0, max(0.0, slices) + max(0.0, multi))
    return 1.0 + gain * exposure


def weights_for(base: Weights, *, load: float, mix: tuple[float, float] | None = None,
                gain: float = MIX_GAIN) -> Weights:
    """`base` moved by the pool's load (0 = all free, 1 = all used) and, when given, by the demand mix's
    (slice share, multi-GPU share); see the module docstring."""
    load = min(1.0, max(0.0, load))
    packing = packing_factor(load=load)
    if mix is not None:
        packing *= mix_factor(slices=mix[0], multi=mix[1], gain=gain)
    return base.scaled(price=price_factor(free_share=1.0 - load), packing=packing)
