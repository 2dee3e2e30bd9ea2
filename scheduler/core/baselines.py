"""Baseline placement policies with the Scheduler's interface (`decide`, `place`), for the simulator to
compare against. All of them obey the same hard constraints (the engine's filters, so every placement they
make is legal) and plan preemption the same way; they differ only in which legal option they pick.

- `FirstFit`: the first GPU in pool order, lowest legal start.
- `BestFit`: the GPU left with the least free capacity after the placement (tightest fit).
- `RandomFit`: a uniformly random fitting GPU and legal start (seeded).
- `WholeGpuRenting`: every request rents whole GPUs (no MIG sharing), first fit — the market without slices.
- `NaiveScan`: the seed article's pseudo-code kept as written, bugs included: score every candidate with
  0.4/price + 0.3/latency + 0.3·(1 − utilisation), multiply every score by 1.5 when "the pool" is under 20%
  (the same factor on every score changes no ranking), take the last of an ascending sort, first legal
  start.
"""
from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from typing import Callable

from nodeagent.hardware import mig

from . import preemption
from .engine import Pool, Scheduler
from .model import Decision, GpuState, Request
from .placement import Option, multi_option, single_option
from .pool import GpuRecord
from .regions import rtt_ms


class BaselinePolicy:
    """Shared machinery: filter every GPU, build options with a fixed start rule, let `pick` choose."""

    name = "baseline"

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._sched = Scheduler(pool, mode="exhaustive")

    def adapt(self, request: Request) -> Request:
        return request

    def start_for(self, rec: GpuRecord, profile: str) -> int:
        return mig.legal_starts(rec.gpu.geometry, [mig.Instance(*x) for x in rec.layout], profile)[0]  # type: ignore[arg-type]

    def pick(self, options: list[tuple[GpuRecord, Option]], request: Request) -> tuple[Option, float] | None:
        raise NotImplementedError

    def _options(self, request: Request) -> list[tuple[GpuRecord, Option]]:
        cache: dict = {}
        out: list[tuple[GpuRecord, Option]] = []
        if request.gpu_count > 1:
            by_node: dict[str, list[tuple[int, GpuState]]] = defaultdict(list)
            first: dict[str, GpuRecord] = {}
            for rec in self.pool.records:
                if self._sched.first_refusal(request, rec.node, rec.gpu, cache) is None:
                    by_node[rec.node.id].append((rec.idx, rec.gpu))
                    first.setdefault(rec.node.id, rec)
            for node_id, gpus in by_node.items():
                gpus = gpus[:request.gpu_count]  # pool order, not packing cost: baselines don't look ahead
                opt = multi_option(self.pool, self.pool.nodes[node_id], gpus, request)
                if opt is not None:
                    out.append((first[node_id], opt))
            return out
        for rec in self.pool.records:
            if self._sched.first_refusal(request, rec.node, rec.gpu, cache) is not None:
                continue
            opt = single_option(self.pool, rec.node, rec.gpu, request, idx=rec.idx)
            if opt is None:
                continue
            if opt.profile is not None:
                opt.start = self.start_for(rec, opt.profile)
            out.append((rec, opt))
        return out

    def decide(self, request: Request, *, allow_preemption: bool = True) -> Decision:
        request = self.adapt(request)
        options = self._options(request)
        chosen = self.pick(options, request) if options else None
        if chosen is not None:
            opt, score = chosen
            return Decision(ok=True, placements=opt.placements(), score=score, breakdown={self.name: score},
                            considered=len(options), price_per_hour=opt.price_per_hour)
        reasons = self._sched.reasons(request)
        if allow_preemption and request.mode != "spot":
            planned = preemption.plan(self._sched, request, self._sched.weights())
            if planned is not None:
                return Decision(ok=True, placements=planned.placements(), breakdown={self.name: 0.0},
                                reasons=reasons, preempt=list(planned.preempt),
                                price_per_hour=planned.price_per_hour)
        return Decision(ok=False, reasons=reasons)

    def place(self, request: Request, *, allow_preemption: bool = True) -> Decision:
        self.pool.mix.observe(request)
        d = self.decide(request, allow_preemption=allow_preemption)
        if d.ok:
            self.pool.allocate(d, self.adapt(request))
        return d


class FirstFit(BaselinePolicy):
    name = "first_fit"

    def pick(self, options, request):
        return options[0][1], 0.0


def _free_after(pool: Pool, rec: GpuRecord, opt: Option) -> float:
    g = rec.gpu
    if opt.profile is None or g.geometry is None:
        return 0.0
    p = g.geometry.profile(opt.profile)
    return rec.free_frac - max(p.memory_slices / g.geometry.memory_slices,
                               p.compute_slices / g.geometry.compute_slices)


class BestFit(BaselinePolicy):
    name = "best_fit"

    def pick(self, options, request):
        rec, opt = min(options, key=lambda t: (_free_after(self.pool, t[0], t[1]), t[0].idx))
        return opt, -_free_after(self.pool, rec, opt)


class RandomFit(BaselinePolicy):
    name = "random_fit"

    def __init__(self, pool: Pool, *, seed: int = 0) -> None:
        super().__init__(pool)
        self.rng = random.Random(seed)

    def start_for(self, rec, profile):
        return self.rng.choice(mig.legal_starts(rec.gpu.geometry, [mig.Instance(*x) for x in rec.layout],  # type: ignore[arg-type]
                                                profile))

    def pick(self, options, request):
        return self.rng.choice(options)[1], 0.0


class WholeGpuRenting(FirstFit):
    name = "whole_gpu"

    def adapt(self, request):
        return dataclasses.replace(request, whole_gpu=True)


class NaiveScan(BaselinePolicy):
    name = "naive_scan"

    def pick(self, options, request):
        scored = []
        for rec, opt in options:
            latency = max(1.0, rtt_ms(request.buyer_region, opt.node.region))
            utilisation = 1.0 - rec.free_frac
            score = 0.4 * (1 / max(opt.price_per_hour, 1e-9)) + 0.3 * (1 / latency) + 0.3 * (1 - utilisation)
            scored.append((score, opt))
        if len(self.pool.records) < 0.2 * len(self.pool.records):  # the seed's test: never true
            scored = [(s * 1.5, o) for s, o in scored]
        best = sorted(scored, key=lambda t: t[0])[-1]
        return best[1], best[0]


POLICIES: dict[str, Callable[[Pool], object]] = {
    "scheduler": lambda pool: Scheduler(pool),
    "naive_scan": NaiveScan,
    "first_fit": FirstFit,
    "best_fit": BestFit,
    "random_fit": RandomFit,
    "whole_gpu": WholeGpuRenting,
}
