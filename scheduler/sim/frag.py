"""Fragmentation and held capacity as the simulator measures them, the same yardstick for every policy.

The measure is the engine's FGD-style one (scheduler.core.fragmentation.frag: the expected share of a GPU
that is free but that no legal placement of a request drawn from the demand mix could cover), but with a
demand mix fixed for the whole replay: the profiles the trace's own pods take on each model. The engine
learns its mix as it goes, which is right for placing but would make the yardstick move under the policies
being compared. Non-MIG GPUs and whole-GPU allocations are never fragmented (they are free or full).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable

from nodeagent.hardware import gpus as gpu_catalog
from nodeagent.hardware import mig
from scheduler.core.fragmentation import frag as fgd_frag
from scheduler.core.model import GpuState, Placement

from .mapping import Demand


def demand_mix(demands: Iterable[Demand], models: Iterable[str]) -> dict[str, tuple[tuple[str, float], ...]]:
    """Per MIG model: (profile, probability) of the profile each demand would take there."""
    counts: dict[str, Counter] = defaultdict(Counter)
    demands = list(demands)
    for key in set(models):
        g = gpu_catalog.model_for(key).mig
        if g is None:
            continue
        for d in demands:
            if d.models is not None and key not in d.models:
                continue
            if d.whole_gpu:
                counts[key][g.full_profile.name] += d.gpu_count
            else:
                p = mig.smallest_fitting_profile(g, memory_gb=d.memory_gb, compute_slices=d.compute_slices)
                if p is not None:
                    counts[key][p.name] += 1
    out = {}
    for key, c in counts.items():
        total = sum(c.values())
        out[key] = tuple(sorted((name, n / total) for name, n in c.items()))
    return out


class FragMeter:
    def __init__(self, mix: dict[str, tuple[tuple[str, float], ...]]) -> None:
        self.mix = mix
        self._cache: dict[tuple, float] = {}

    def of(self, gpu: GpuState) -> float:
        """Fragmented share of one GPU (0..1) under the fixed mix."""
        if gpu.geometry is None or not gpu.instances:
            return self._empty(gpu)
        if any(i.profile is None for i in gpu.instances):
            return 0.0
        layout = tuple(sorted((i.profile, i.start) for i in gpu.instances))
        key = (gpu.model, layout)
        value = self._cache.get(key)
        if value is None:
            dist = self.mix.get(gpu.model, ())
            value = fgd_frag(gpu.geometry, [mig.Instance(p, s) for p, s in layout], dist) if dist else 0.0
            self._cache[key] = value
        return value

    def _empty(self, gpu: GpuState) -> float:
        if gpu.geometry is None:
            return 0.0
        key = (gpu.model, ())
        if key not in self._cache:
            dist = self.mix.get(gpu.model, ())
            self._cache[key] = fgd_frag(gpu.geometry, [], dist) if dist else 0.0
        return self._cache[key]

    @staticmethod
    def held(gpus: dict[str, GpuState], placements: list[Placement]) -> float:
        """GPUs' worth of compute locked up by `placements`: a MIG instance counts its compute share."""
        total = 0.0
        for p in placements:
            g = gpus[p.gpu_uuid].geometry
            if p.profile is None or g is None:
                total += 1.0
            else:
                total += g.profile(p.profile).compute_slices / g.compute_slices
        return total
