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
(GPUs where the needed profile has a legal start, per model and region, best static node key first),
runs the same filters and scorers on those, and stops after `max_candidates` GPUs passed the filters.
Both are complete: a request that fits somewhere is never reported unschedulable by "fast". Where "fast"
chooses differently, its choice scored lower under the same scorers; bench/decision_speed.py measures how
often and by how much.
"""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from typing import Literal, Sequence

from . import mig, preemption
from .filters import DEFAULT_FILTERS, Filter
from .model import Decision, GpuState, NodeState, Placement, Request
from .placement import Option, multi_option, single_option
from .pool import FIXED, WHOLE, CapacityError, GpuRecord, Pool
from .regions import rtt_ms
from .scorers import DEFAULT_SCORERS, LatencyScorer, Scorer
from .weights import DEFAULT_WEIGHTS, Weights, weights_for

__all__ = ["Pool", "Scheduler", "CapacityError"]

_LATENCY = LatencyScorer()


class Scheduler:
    """Decides where requests go on one `Pool`. Filters, scorers and weights are plugins/data."""

    def __init__(self, pool: Pool, *, weights: Weights | None = None,
                 mode: Literal["fast", "exhaustive"] = "fast",
                 filters: Sequence[Filter] = DEFAULT_FILTERS, scorers: Sequence[Scorer] = DEFAULT_SCORERS,
                 adapt_weights: bool = True, max_candidates: int = 24, packing_candidates: int = 12) -> None:
        if mode not in ("fast", "exhaustive"):
            raise ValueError(f"mode is 'fast' or 'exhaustive', not {mode!r}")
        self.pool = pool
        self.base_weights = weights or DEFAULT_WEIGHTS
        self.mode = mode
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.adapt_weights = adapt_weights
        self.max_candidates = max_candidates
        self.packing_candidates = packing_candidates
        self._rank_cache: dict[tuple[str, str], tuple[tuple[int, int], list]] = {}
        self._shares: dict[Weights, list[tuple[Scorer, float]]] = {}

    # --- public --------------------------------------------------------------------------------------

    def weights(self) -> Weights:
        """The weights in force now: the base weights moved by the pool's load (weights.weights_for)."""
        if not self.adapt_weights:
            return self.base_weights
        return weights_for(self.base_weights, load=1.0 - self.pool.free_share())

    def decide(self, request: Request, *, allow_preemption: bool = True, explain: bool = True) -> Decision:
        """Where `request` should go, or why it cannot; never changes the pool.

        `explain=False` leaves `reasons` empty on an unschedulable decision: counting every GPU's refusal
        is O(pool), which a caller that never shows reasons (a simulator's retry loop) can skip."""
        problem = _invalid(request)
        if problem:
            return Decision(ok=False, reasons={problem: len(self.pool.records)})
        weights = self.weights()
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
        shares = self._shares.get(weights)
        if shares is None:
            total_w = sum(weights.get(s.name) for s in self.scorers) or 1.0
            if len(self._shares) > 64:
                self._shares.clear()  # weights move with load: keep the memo small
            shares = self._shares[weights] = [(s, weights.get(s.name) / total_w) for s in self.scorers]
        breakdown = {s.name: share * s.score(option, request) for s, share in shares}
        return sum(breakdown.values()), breakdown

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

    def first_refusal(self, request: Request, node: NodeState, gpu: GpuState,
                      cache: dict | None = None, *, skip: frozenset[str] = frozenset()) -> str | None:
        """The first filter's reason for refusing `gpu`, or None when every filter passes. `cache` (one
        dict per decision) reuses model- and node-scope answers."""
        for i, f in enumerate(self.filters):
            if f.name in skip:
                continue
            if cache is not None and f.scope != "gpu":
                key = (i, node.id) if f.scope == "node" else (i, gpu.model, gpu.geometry is None)
                if key in cache:
                    reason = cache[key]
                else:
                    reason = cache[key] = f.check(request, node, gpu, self.pool)
            else:
                reason = f.check(request, node, gpu, self.pool)
            if reason:
                return reason
        return None

    def alive_kinds(self, request: Request, counts: Counter | None = None) -> set[tuple[str, bool]]:
        """(model, MIG off) kinds that pass the leading model-scope filters; the refused ones are added
        to `counts` in bulk."""
        lead = []
        for f in self.filters:
            if f.scope != "model":
                break
            lead.append(f)
        alive: set[tuple[str, bool]] = set()
        for kind, recs in self.pool.by_kind.items():
            rep = recs[0]
            reason = next((r for f in lead if (r := f.check(request, rep.node, rep.gpu, self.pool))), None)
            if reason is None:
                alive.add(kind)
            elif counts is not None:
                counts[reason] += len(recs)
        return alive

    def reasons(self, request: Request) -> dict[str, int]:
        """Every GPU's first refusal, counted (the same in both modes).

        Counted in bulk where it is safe: a refusal by the leading model-scope filters covers every GPU of
        that model and MIG mode; GPUs of one node with the same model, MIG mode, health and placeable
        profiles (pool.node_groups) get the same answer from every groupable filter, so one is checked."""
        pool = self.pool
        counts: Counter[str] = Counter()
        cache: dict = {}
        if not all(getattr(f, "groupable", True) for f in self.filters):
            for rec in pool.records:
                counts[self.first_refusal(request, rec.node, rec.gpu, cache) or "fits"] += 1
            counts.pop("fits", None)
            return dict(counts)
        alive = self.alive_kinds(request, counts)
        for node_id, groups in pool.node_groups.items():
            for sig, members in groups.items():
                if (sig[0], sig[1]) in alive:
                    rec = pool.records[next(iter(members))]
                    counts[self.first_refusal(request, rec.node, rec.gpu, cache) or "fits"] += len(members)
        counts.pop("fits", None)
        return dict(counts)

    # --- internals -----------------------------------------------------------------------------------

    def _decision(self, opt: Option, request: Request, weights: Weights, considered: int) -> Decision:
        score, breakdown = self.score(opt, request, weights)
        return Decision(ok=True, placements=opt.placements(), score=score, breakdown=breakdown,
                        considered=considered, price_per_hour=opt.price_per_hour)

    def _better(self, s: float, opt: Option, best: tuple[float, Option] | None) -> bool:
        return best is None or s > best[0] or (s == best[0] and opt.idx < best[1].idx)

    def _exhaustive(self, request: Request, weights: Weights) -> tuple[Option | None, int]:
        cache: dict = {}
        best: tuple[float, Option] | None = None
        considered = 0
        if request.gpu_count > 1:
            by_node: dict[str, list[tuple[int, GpuState]]] = defaultdict(list)
            for rec in self.pool.records:
                if self.first_refusal(request, rec.node, rec.gpu, cache) is None:
                    by_node[rec.node.id].append((rec.idx, rec.gpu))
            for node_id, gpus in by_node.items():
                considered += len(gpus)
                opt = multi_option(self.pool, self.pool.nodes[node_id], gpus, request)
                if opt is not None:
                    s = self.score(opt, request, weights)[0]
                    if self._better(s, opt, best):
                        best = (s, opt)
            return (best[1] if best else None), considered
        for rec in self.pool.records:
            if self.first_refusal(request, rec.node, rec.gpu, cache) is not None:
                continue
            opt = single_option(self.pool, rec.node, rec.gpu, request, idx=rec.idx)
            if opt is None:
                continue
            considered += 1
            s = self.score(opt, request, weights)[0]
            if self._better(s, opt, best):
                best = (s, opt)
        return (best[1] if best else None), considered

    def _nodes(self, request: Request, weights: Weights, node_ids: list[str]) -> tuple[Option | None, int]:
        """k GPUs on one node: every node in `node_ids` (those with at least k free GPUs)."""
        cache: dict = {}
        best: tuple[float, Option] | None = None
        considered = 0
        for node_id in node_ids:
            recs = self.pool.by_node[node_id]
            gpus = [(r.idx, r.gpu) for r in recs if self.first_refusal(request, r.node, r.gpu, cache) is None]
            opt = multi_option(self.pool, recs[0].node, gpus, request) if gpus else None
            if opt is not None:
                considered += len(gpus)
                s = self.score(opt, request, weights)[0]
                if self._better(s, opt, best):
                    best = (s, opt)
        return (best[1] if best else None), considered

    def _lists(self, request: Request) -> list[tuple[float, list[tuple[float, int]]]]:
        """Index lists that can hold a fitting GPU, each with the latency term of its region."""
        pool = self.pool
        out = []
        wl = DEFAULT_WEIGHTS.get("latency")
        alive = self.alive_kinds(request)
        for model in sorted({m for m, _ in alive}):
            keys = {FIXED} if (model, True) in alive else set()
            if (model, False) not in alive:
                pass
            elif request.wants_whole:
                keys.add(WHOLE)
            elif (g := pool.spec(model).mig) is not None:
                p = mig.smallest_fitting_profile(g, memory_gb=request.memory_gb,
                                                 compute_slices=request.compute_slices)
                if p is not None:
                    keys.add(p.name)
            for key in keys:
                for region, lst in pool.avail.get((model, key), {}).items():
                    if lst and (request.regions is None or region in request.regions):
                        lat = wl * _LATENCY.normalise(rtt_ms(request.buyer_region, region))
                        out.append((lat, lst))
        return out

    def _fast(self, request: Request, weights: Weights) -> tuple[Option | None, int]:
        pool = self.pool
        if request.gpu_count > 1:
            ready = pool.nodes_with_free(request.gpu_count)
            if len(ready) <= 4 * self.max_candidates:
                return self._nodes(request, weights, ready)  # few enough: check them all, exactly
        lists = self._lists(request)
        # list entries are (-static key, pool index); the heap pops the highest key + latency term first
        heap = [(-(lat - lst[0][0]), n, 0) for n, (lat, lst) in enumerate(lists)]
        heapq.heapify(heap)
        cache: dict = {}
        seen: set[int] = set()
        seen_nodes: set[str] = set()
        best: tuple[float, Option] | None = None
        considered = 0
        while heap and considered < self.max_candidates:
            _, n, pos = heapq.heappop(heap)
            lat, lst = lists[n]
            if pos + 1 < len(lst):
                heapq.heappush(heap, (-(lat - lst[pos + 1][0]), n, pos + 1))
            idx = lst[pos][1]
            if idx in seen:
                continue
            seen.add(idx)
            rec: GpuRecord = pool.records[idx]
            if request.gpu_count > 1:
                if rec.node.id in seen_nodes or pool.node_free[rec.node.id] < request.gpu_count:
                    continue
                seen_nodes.add(rec.node.id)
                gpus = [(r.idx, r.gpu) for r in pool.by_node[rec.node.id]
                        if self.first_refusal(request, r.node, r.gpu, cache) is None]
                opt = multi_option(pool, rec.node, gpus, request) if gpus else None
                considered += len(gpus) if opt else 0
            else:
                if self.first_refusal(request, rec.node, rec.gpu, cache) is not None:
                    continue
                opt = single_option(pool, rec.node, rec.gpu, request, idx=idx)
                considered += 1 if opt else 0
            if opt is not None:
                s = self.score(opt, request, weights)[0]
                if self._better(s, opt, best):
                    best = (s, opt)
        if request.gpu_count == 1 and not request.wants_whole and self.packing_candidates:
            for idx in self._best_packing(request):
                if idx in seen:
                    continue
                seen.add(idx)
                rec = pool.records[idx]
                if self.first_refusal(request, rec.node, rec.gpu, cache) is not None:
                    continue
                opt = single_option(pool, rec.node, rec.gpu, request, idx=idx)
                if opt is None:
                    continue
                considered += 1
                s = self.score(opt, request, weights)[0]
                if self._better(s, opt, best):
                    best = (s, opt)
        return (best[1] if best else None), considered

    def _best_packing(self, request: Request):
        """GPUs in order of packing cost (layout buckets, lowest Δfrag first), best static key first
        within a bucket; yields until `packing_candidates` of them were offered. The static walk above
        ignores packing, so this second, short walk brings the tightest fits into the comparison."""
        pool = self.pool
        ranked: list[tuple[float, tuple[float, int], list[tuple[float, int]]]] = []
        for model, mig_off in sorted(self.alive_kinds(request)):
            g = pool.spec(model).mig
            if mig_off or g is None:
                continue
            p = mig.smallest_fitting_profile(g, memory_gb=request.memory_gb, compute_slices=request.compute_slices)
            if p is None:
                continue
            buckets = pool.by_layout.get((model, p.name), {})
            for delta, layout in self._layout_rank(model, g, p.name):
                lst = buckets.get(layout)
                if lst:
                    ranked.append((delta, lst[0], lst))
        ranked.sort(key=lambda t: (t[0], t[1]))  # equal Δfrag: the bucket with the best node first
        offered = 0
        for _, _, lst in ranked:
            for _, idx in lst:
                yield idx
                offered += 1
                if offered >= self.packing_candidates:
                    return

    def _layout_rank(self, model: str, g: mig.MigGeometry, profile: str) -> list[tuple[float, tuple]]:
        """Layouts holding GPUs where `profile` fits, by Δfrag of placing it; cached until a layout
        bucket comes or goes or the demand mix is refreshed."""
        pool = self.pool
        key = (model, profile)
        stamp = (pool.layout_epoch[key], pool.mix.version)
        hit = self._rank_cache.get(key)
        if hit is None or hit[0] != stamp:
            ranked = []
            for layout in pool.by_layout.get(key, {}):
                best = pool.frags.best_start(model, g, layout, profile)
                if best is not None:
                    ranked.append((best[1], layout))
            ranked.sort()
            hit = self._rank_cache[key] = (stamp, ranked)
        return hit[1]


def _invalid(request: Request) -> str | None:
    if request.gpu_count < 1:
        return "gpu_count must be at least 1"
    if request.memory_gb < 0 or request.compute_slices < 0:
        return "memory and compute must be >= 0"
    if request.mode not in ("reserved", "on_demand", "spot"):
        return f"unknown class {request.mode!r}"
    return None
