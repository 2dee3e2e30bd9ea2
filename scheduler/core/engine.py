"""The scheduler: filter, score, place, and plan preemption, on a `Pool` (DESIGN §6).

    pool = Pool(nodes)                       # NodeState snapshot -> indexed pool (deep copy)
    sched = Scheduler(pool)                  # mode="fast" (indexes) or "exhaustive" (reference)
    d = sched.decide(Request(memory_gb=20))  # pure: never changes the pool
    if d.ok: pool.allocate(d, request)       # or sched.place(request), which also learns the demand mix

Pipeline per GPU: filters in order (first refusal is counted in `Decision.reasons`) -> placement option
(profile, start, packing cost; placement.py) -> scorers, each 0..100, times weight shares from
`weights_for(base, load=pool load)` -> the best option (ties: lower pool index). When nothing fits and the
request is reserved or on demand, preemption.py looks for the cheapest set of spot leases to remove.

"exhaustive" runs every filter and scorer on every GPU. "fast" walks the pool's availability index
(GPUs where the needed profile has a legal start, per model and region) best estimate first — static node
key (with the interruption term for spot), latency term, the packing cost a list's GPUs share and their
node term — runs the same filters and scorers on those, and stops after `max_candidates` GPUs passed the
filters; a second walk takes the best-packing layouts in the same estimate order (fast_path.py).
Both are complete: a request that fits somewhere is never reported unschedulable by "fast". Where "fast"
chooses differently, its choice scored lower under the same scorers; bench/decision_speed.py measures how
often and by how much.

Fractional shares (`Request.gpu_milli`) of GPUs not in MIG mode, and every request on such GPUs in a pool
given a workload, are searched by milli_path.py (free-milli buckets, FGD's Δfrag); host CPU and memory are
checked by the `HostResources` filter wherever nodes model them.

This module holds `Scheduler` (deciding, placing, scoring); its parts live beside it as mixins:
filtering.py (filter checks, alive kinds), fast_path.py (the candidate walks), exhaustive.py (the
reference) and reasons.py (refusal counting). `Pool` and `CapacityError` are re-exported from pool.py.
"""
from __future__ import annotations

from typing import Literal, Sequence

from nodeagent.hardware import mig

from . import preemption
from .exhaustive import ExhaustiveSearch
from .fast_path import FastSearch
from .filtering import FilterChecks
from .filters import DEFAULT_FILTERS, Filter
from .milli_path import MilliSearch
from .model import Decision, Placement, Request
from .placement import Option, multi_option, single_option
from .pool import CapacityError, Pool
from .reasons import ReasonCounting
from .scorers import DEFAULT_SCORERS, Scorer
from .weights import DEFAULT_WEIGHTS, Weights, weights_for

__all__ = ["Pool", "Scheduler", "CapacityError"]


class Scheduler(MilliSearch, FastSearch, ExhaustiveSearch, ReasonCounting, FilterChecks):
    """Decides where requests go on one `Pool`. Filters, scorers and weights are plugins/data."""

    def __init__(self, pool: Pool, *, weights: Weights | None = None,
                 mode: Literal["fast", "exhaustive"] = "fast",
                 filters: Sequence[Filter] = DEFAULT_FILTERS, scorers: Sequence[Scorer] = DEFAULT_SCORERS,
                 adapt_weights: bool = True, max_candidates: int = 8, packing_candidates: int = 6,
                 mix_gain: float | None = None) -> None:
        if mode not in ("fast", "exhaustive"):
            raise ValueError(f"mode is 'fast' or 'exhaustive', not {mode!r}")
        self.pool = pool
        self.base_weights = weights or DEFAULT_WEIGHTS
        self.mode = mode
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.adapt_weights = adapt_weights
        # None: weights follow load only; a gain: also the learnt demand mix (weights.weights_for)
        self.mix_gain = mix_gain
        self.max_candidates = max_candidates
        self.packing_candidates = packing_candidates
        self._rank_cache: dict[tuple[str, str], tuple[tuple[int, int], list]] = {}
        self._shares: dict[Weights, list[tuple[Scorer, float]]] = {}
        self._cur_weights: Weights | None = None  # the weights of the decision in progress, and their shares
        self._cur_shares: list[tuple[Scorer, float]] = []
        self._cur_fns: list = []  # (raw, normalise, share) per scorer for the decision in progress
        self._alive_memo: tuple | None = None  # (request, alive kinds, refused counts) within one decide
        self._filters_memo: tuple | None = None  # (request, active filters) within one decide
        self._fit_memo: dict[tuple, mig.MigProfile | None] = {}
        self._lat_memo: dict[tuple, float] = {}
        self._lats_memo: dict[tuple, dict[str, float]] = {}
        self._kinds_memo: dict[tuple, tuple] = {}  # model-scope request fields -> (alive kinds, refused counts)
        self._lists_memo: dict[tuple, tuple] = {}  # the same + regions, buyer region -> (avail epoch, lists)
        self._weights_memo: tuple | None = None  # (base weights, load, weights_for(...), mix shares)
        self._shares_last: tuple | None = None  # (weights object, its shares)

    # --- public --------------------------------------------------------------------------------------

    def weights(self) -> Weights:
        """The weights in force now: the base weights moved by the pool's load (weights.weights_for)."""
        if not self.adapt_weights:
            return self.base_weights
        load = 1.0 - self.pool.free_share()
        mix = None if self.mix_gain is None else self.pool.mix.shape_shares()
        memo = self._weights_memo
        if memo is not None and memo[0] is self.base_weights and memo[1] == load and memo[3] == mix:
            return memo[2]  # the same object: its scorer shares are then found without hashing
        w = weights_for(self.base_weights, load=load, mix=mix, gain=self.mix_gain or 0.0)
        self._weights_memo = (self.base_weights, load, w, mix)
        return w

    def decide(self, request: Request, *, allow_preemption: bool = True, explain: bool = True) -> Decision:
        """Where `request` should go, or why it cannot; never changes the pool.

        `explain=False` leaves `reasons` empty on an unschedulable decision: counting every GPU's refusal
        is O(pool), which a caller that never shows reasons (a simulator's retry loop) can skip."""
        problem = _invalid(request)
        if problem:
            return Decision(ok=False, reasons={problem: len(self.pool.records)})
        weights = self.weights()
        if weights is not self._cur_weights:
            self._cur_weights, self._cur_shares = weights, self._shares_for(weights)
            self._cur_fns = [(sc.raw, sc.normalise, share) if type(sc).score is Scorer.score
                             else (None, sc.score, share) for sc, share in self._cur_shares]
        self._alive_memo = (request, None, None)
        # exhaustive stays the literal reference: every filter on every GPU, none skipped as inactive
        self._filters_memo = (request, self._active_filters(request) if self.mode == "fast" else
                              tuple((i, f, f.scope) for i, f in enumerate(self.filters)))
        try:
            return self._decide(request, weights, allow_preemption, explain)
        finally:
            self._alive_memo = self._filters_memo = None

    def _decide(self, request: Request, weights: Weights, allow_preemption: bool, explain: bool) -> Decision:
        if self._milli_applies(request):  # fractional sharing (milli_path.py); spot shares are not preempted
            best, considered = self._milli(request, weights)
            if best is not None:
                return self._decision(best, request, weights, considered)
            return Decision(ok=False, reasons=self.reasons(request) if explain else {}, considered=considered)
        if self.mode == "exhaustive":
            best, considered = self._exhaustive(request, weights)
        else:
            best, considered = self._fast(request, weights)
        if best is not None:
            return self._decision(best, request, weights, considered)
        reasons = self.reasons(request) if explain else {}
        if allow_preemption and request.mode != "spot":
            planned = preemption.plan(self, request, weights)
            if planned is not None:
                d = self._decision(planned, request, weights, considered)
                d.preempt = list(planned.preempt)
                d.reasons = reasons
                return d
        return Decision(ok=False, reasons=reasons, considered=considered)

    def place(self, request: Request, *, allow_preemption: bool = True, explain: bool = True) -> Decision:
        """Learn the request into the demand mix, decide, and allocate when it fits."""
        self.pool.mix.observe(request)
        d = self.decide(request, allow_preemption=allow_preemption, explain=explain)
        if d.ok:
            self.pool.allocate(d, request)
        return d

    def score(self, option: Option, request: Request, weights: Weights | None = None
              ) -> tuple[float, dict[str, float]]:
        """(score 0..100, per-plugin weighted contributions) of one option."""
        weights = weights or self.weights()
        shares = self._cur_shares if weights is self._cur_weights else self._shares_for(weights)
        breakdown = {s.name: share * s.score(option, request) for s, share in shares}
        return sum(breakdown.values()), breakdown

    def value(self, option: Option, request: Request, weights: Weights) -> float:
        """`score(...)[0]` without the breakdown (the same float: the same terms summed in the same order)."""
        if weights is self._cur_weights:
            fns = self._cur_fns
        else:
            fns = [(s.raw, s.normalise, share) if type(s).score is Scorer.score else (None, s.score, share)
                   for s, share in self._shares_for(weights)]
        total = 0
        for raw, norm, share in fns:
            # Scorer.score is normalise(raw(...)): called directly, the same float
            total += share * (norm(raw(option, request)) if raw is not None else norm(option, request))
        return total

    def _shares_for(self, weights: Weights) -> list[tuple[Scorer, float]]:
        last = self._shares_last
        if last is not None and last[0] is weights:
            return last[1]
        shares = self._shares.get(weights)
        if shares is None:
            total_w = sum(weights.get(s.name) for s in self.scorers) or 1.0
            if len(self._shares) > 64:
                self._shares.clear()  # weights move with load: keep the memo small
            shares = self._shares[weights] = [(s, weights.get(s.name) / total_w) for s in self.scorers]
        self._shares_last = (weights, shares)
        return shares

    def rescore(self, decision: Decision, request: Request) -> float:
        """Score of an existing decision's placement under this scheduler's scorers and current weights
        (the bench re-scores the fast choice this way). The placement must still be possible."""
        opt = self.option_for(decision.placements, request)
        return self.score(opt, request)[0] if opt else float("nan")

    def option_for(self, placements: Sequence[Placement], request: Request) -> Option | None:
        if not placements:
            return None
        recs = [self.pool.record(p.gpu_uuid) for p in placements]
        node = recs[0].node
        if len(recs) > 1:
            return multi_option(self.pool, node, [(r.idx, r.gpu) for r in recs], request)
        return single_option(self.pool, node, recs[0].gpu, request, idx=recs[0].idx)

    # --- internals -----------------------------------------------------------------------------------

    def _decision(self, opt: Option, request: Request, weights: Weights, considered: int) -> Decision:
        score, breakdown = self.score(opt, request, weights)
        return Decision(ok=True, placements=opt.placements(), score=score, breakdown=breakdown,
                        considered=considered, price_per_hour=opt.price_per_hour)

    def _better(self, s: float, opt: Option, best: tuple[float, Option] | None) -> bool:
        return best is None or s > best[0] or (s == best[0] and opt.idx < best[1].idx)


def _invalid(request: Request) -> str | None:
    if request.gpu_count < 1:
        return "gpu_count must be at least 1"
    if request.memory_gb < 0 or request.compute_slices < 0:
        return "memory and compute must be >= 0"
    if request.gpu_milli and not (0 < request.gpu_milli < 1000 and request.gpu_count == 1 and not request.whole_gpu
                                  and request.profile is None):
        return "a GPU share is 1 to 999 milli of one GPU"
    if request.cpu_milli < 0 or request.memory_mib < 0:
        return "CPU and memory must be >= 0"
    if request.mode not in ("reserved", "on_demand", "spot"):
        return f"unknown class {request.mode!r}"
    return None
