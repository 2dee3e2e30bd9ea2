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
from .pool import CLASS_FIELDS, FIXED, WHOLE, CapacityError, GpuRecord, Pool
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
        self._cur_weights: Weights | None = None  # the weights of the decision in progress, and their shares
        self._cur_shares: list[tuple[Scorer, float]] = []
        self._alive_memo: tuple | None = None  # (request, alive kinds, refused counts) within one decide
        self._filters_memo: tuple | None = None  # (request, active filters) within one decide
        self._fit_memo: dict[tuple, mig.MigProfile | None] = {}
        self._lat_memo: dict[tuple, float] = {}

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
        self._cur_weights, self._cur_shares = weights, self._shares_for(weights)
        self._alive_memo = (request, None, None)
        # exhaustive stays the literal reference: every filter on every GPU, none skipped as inactive
        self._filters_memo = (request, self._active_filters(request) if self.mode == "fast" else
                              tuple((i, f, f.scope) for i, f in enumerate(self.filters)))
        try:
            return self._decide(request, weights, allow_preemption, explain)
        finally:
            self._alive_memo = self._filters_memo = None

    def _decide(self, request: Request, weights: Weights, allow_preemption: bool, explain: bool) -> Decision:
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
        shares = self._cur_shares if weights is self._cur_weights else self._shares_for(weights)
        total = 0
        for s, share in shares:
            total += share * s.score(option, request)
        return total

    def _shares_for(self, weights: Weights) -> list[tuple[Scorer, float]]:
        shares = self._shares.get(weights)
        if shares is None:
            total_w = sum(weights.get(s.name) for s in self.scorers) or 1.0
            if len(self._shares) > 64:
                self._shares.clear()  # weights move with load: keep the memo small
            shares = self._shares[weights] = [(s, weights.get(s.name) / total_w) for s in self.scorers]
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

    def first_refusal(self, request: Request, node: NodeState, gpu: GpuState,
                      cache: dict | None = None, *, skip: frozenset[str] = frozenset(),
                      node_key: object = None) -> str | None:
        """The first filter's reason for refusing `gpu`, or None when every filter passes. `cache` (one
        dict per decision) reuses model- and node-scope answers, node ones under `node_key` (default: the
        node id; the reason buckets pass the node class)."""
        if node_key is None:
            node_key = node.id
        memo = self._filters_memo
        active = memo[1] if memo is not None and memo[0] is request else self._active_filters(request)
        pool = self.pool
        for i, f, scope in active:
            if skip and f.name in skip:
                continue
            if cache is not None and scope != "gpu":
                key = (i, node_key) if scope == "node" else (i, gpu.model, gpu.geometry is None)
                reason = cache.get(key, False)
                if reason is False:
                    reason = cache[key] = f.check(request, node, gpu, pool)
            else:
                reason = f.check(request, node, gpu, pool)
            if reason:
                return reason
        return None

    def _active_filters(self, request: Request) -> tuple[tuple[int, Filter, str], ...]:
        """(position, filter, scope) of the filters that can refuse something for `request`."""
        return tuple((i, f, f.scope) for i, f in enumerate(self.filters) if f.active(request))

    def alive_kinds(self, request: Request, counts: Counter | None = None) -> set[tuple[str, bool]]:
        """(model, MIG off) kinds that pass the leading model-scope filters; the refused ones are added
        to `counts` in bulk."""
        memo = self._alive_memo
        if memo is not None and memo[0] is request:
            if memo[1] is None:
                refused: Counter[str] = Counter()
                self._alive_memo = memo = (request, self._alive_kinds(request, refused), refused)
            if counts is not None:
                counts.update(memo[2])
            return memo[1]
        return self._alive_kinds(request, counts)

    def _alive_kinds(self, request: Request, counts: Counter | None) -> set[tuple[str, bool]]:
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
        """Every GPU's first refusal, counted (the same in both modes, and equal to checking every GPU).

        Counted in bulk where it is safe: a refusal by the leading model-scope filters covers every GPU of
        that model and MIG mode. Then, where every active filter is groupable and reads only the node
        fields in `pool.CLASS_FIELDS`, one GPU per reason bucket (pool.reason_buckets: node class and GPU
        sig) is checked, and per-node-free filters (k GPUs on one node) once per free-node bucket: the cost
        is O(buckets), which stops growing with the pool. Otherwise (a price cap: its answer depends on each
        node's price) GPUs of one node with the same sig (pool.node_groups) are checked once: O(nodes)."""
        counts = self._bucket_reasons(request)
        if counts is not None:
            return counts
        return self._node_group_reasons(request)

    def _bucket_path(self, request: Request) -> tuple[bool, frozenset[str]]:
        """(can reasons be counted per bucket, names of the active per-node-free filters)."""
        per_node: list[str] = []
        for f in self.filters:
            if not f.active(request):
                continue
            if f.scope == "model":
                if per_node:
                    return False, frozenset()
                continue
            fields = f.node_fields
            if not f.groupable or fields is None or not set(fields) <= set(CLASS_FIELDS):
                return False, frozenset()
            if f.per_node_free:
                per_node.append(f.name)
            elif per_node:
                return False, frozenset()  # per-node-free filters must come last
        return True, frozenset(per_node)

    def _bucket_reasons(self, request: Request) -> dict[str, int] | None:
        ok, per_node = self._bucket_path(request)
        if not ok:
            return None
        pool = self.pool
        counts: Counter[str] = Counter()
        cache: dict = {}
        alive = self.alive_kinds(request, counts)
        passing: set[tuple] = set()  # buckets that pass every filter but the per-node-free ones
        for key, members in (kv for kind in alive for kv in pool.reason_buckets.get(kind, {}).items()):
            rec = pool.records[next(iter(members))]
            reason = self.first_refusal(request, rec.node, rec.gpu, cache, skip=per_node, node_key=key[0])
            if reason is not None:
                counts[reason] += len(members)
            elif per_node:
                if rec.gpu.instances or not rec.schedulable:
                    return None  # only free GPUs may reach a per-node-free filter (a custom filter set)
                passing.add(key)
        if passing:
            last = [f for f in self.filters if f.name in per_node]
            # filters that read no node field answer alike for every node with the same free GPUs
            by_free_only = all(f.node_fields == () for f in last)
            answers: dict[tuple, str | None] = {}
            for cls in {c for c, _ in passing}:
                for free, node_ids in pool.free_nodes.get(cls, {}).items():
                    here = [sig for sig in free if (cls, sig) in passing]
                    if not here:
                        continue
                    node = pool.nodes[next(iter(node_ids))]
                    seen = answers.setdefault(free, {}) if by_free_only else {}
                    for sig in here:
                        if sig not in seen:
                            gpu = next(r.gpu for r in pool.by_node[node.id]
                                       if r.sig == sig and not r.gpu.instances)
                            seen[sig] = next((r for f in last if (r := f.check(request, node, gpu, pool))), None)
                        if seen[sig] is not None:
                            counts[seen[sig]] += len(node_ids)
        return dict(counts)

    def _node_group_reasons(self, request: Request) -> dict[str, int]:
        """The O(nodes) count: one GPU per (node, sig) group (or every GPU, for non-groupable filters)."""
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
                    s = self.value(opt, request, weights)
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
            s = self.value(opt, request, weights)
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
                s = self.value(opt, request, weights)
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
                p = self._fitting(model, g, request)
                if p is not None:
                    keys.add(p.name)
            for key in keys:
                for region, lst in pool.avail.get((model, key), {}).items():
                    if lst and (request.regions is None or region in request.regions):
                        lk = (request.buyer_region, region)
                        lat = self._lat_memo.get(lk)
                        if lat is None:
                            lat = self._lat_memo[lk] = wl * _LATENCY.normalise(rtt_ms(request.buyer_region, region))
                        out.append((lat, lst))
        return out

    def _fitting(self, model: str, g: mig.MigGeometry, request: Request) -> mig.MigProfile | None:
        """`mig.smallest_fitting_profile` for the request's memory and compute, memoised per model."""
        key = (model, request.memory_gb, request.compute_slices)
        try:
            return self._fit_memo[key]
        except KeyError:
            if len(self._fit_memo) > 4096:
                self._fit_memo.clear()
            p = self._fit_memo[key] = mig.smallest_fitting_profile(
                g, memory_gb=request.memory_gb, compute_slices=request.compute_slices)
            return p

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
                s = self.value(opt, request, weights)
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
                s = self.value(opt, request, weights)
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
            p = self._fitting(model, g, request)
            if p is None:
                continue
            buckets = pool.by_layout.get((model, p.name), {})
            enough, last = 0, None
            for delta, layout in self._layout_rank(model, g, p.name):
                if enough >= self.packing_candidates and delta != last:
                    break  # this kind's buckets so far fill the walk before any later one is reached
                lst = buckets.get(layout)
                if lst:
                    ranked.append((delta, lst[0], lst))
                    enough += len(lst)
                    last = delta
        # equal Δfrag: the bucket with the best node first; (Δfrag, first entry) is unique per bucket, so
        # the heap never compares the lists. Only the first few buckets are needed: pop, don't sort.
        heapq.heapify(ranked)
        offered = 0
        while ranked:
            for _, idx in heapq.heappop(ranked)[2]:
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
