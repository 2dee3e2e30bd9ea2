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
from .filters import DEFAULT_FILTERS, ComputeCapability, Filter, MemoryPerSlice, ModelAllowed
from .model import Decision, GpuState, NodeState, Placement, Request
from .placement import Option, multi_option, single_option, waste_for
from .pool import CLASS_FIELDS, FIXED, WHOLE, CapacityError, GpuRecord, Pool
from .regions import rtt_ms
from .scorers import DEFAULT_SCORERS, LatencyScorer, Scorer
from .weights import DEFAULT_WEIGHTS, Weights, weights_for

__all__ = ["Pool", "Scheduler", "CapacityError"]

_LATENCY = LatencyScorer()
_MODEL_FILTERS = (ModelAllowed, ComputeCapability, MemoryPerSlice)
_SPLIT = object()  # key of the per-decision filter split in Scheduler._passes' cache


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
        self._cur_fns: list = []  # (raw, normalise, share) per scorer for the decision in progress
        self._alive_memo: tuple | None = None  # (request, alive kinds, refused counts) within one decide
        self._filters_memo: tuple | None = None  # (request, active filters) within one decide
        self._fit_memo: dict[tuple, mig.MigProfile | None] = {}
        self._lat_memo: dict[tuple, float] = {}
        self._lats_memo: dict[tuple, dict[str, float]] = {}
        self._kinds_memo: dict[tuple, tuple] = {}  # model-scope request fields -> (alive kinds, refused counts)
        self._lists_memo: dict[tuple, tuple] = {}  # the same + regions, buyer region -> (avail epoch, lists)
        self._weights_memo: tuple | None = None  # (base weights, load, weights_for(base, load))
        self._shares_last: tuple | None = None  # (weights object, its shares)

    # --- public --------------------------------------------------------------------------------------

    def weights(self) -> Weights:
        """The weights in force now: the base weights moved by the pool's load (weights.weights_for)."""
        if not self.adapt_weights:
            return self.base_weights
        load = 1.0 - self.pool.free_share()
        memo = self._weights_memo
        if memo is not None and memo[0] is self.base_weights and memo[1] == load:
            return memo[2]  # the same object: its scorer shares are then found without hashing
        w = weights_for(self.base_weights, load=load)
        self._weights_memo = (self.base_weights, load, w)
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

    def _passes(self, request: Request, rec: GpuRecord, cache: dict) -> bool:
        """`first_refusal(...) is None` for the fast walks, which need no reason: model-scope filters are
        answered once per (model, MIG mode) and node-scope ones once per node, all together (whether every
        filter passes does not depend on their order)."""
        split = cache.get(_SPLIT)
        if split is None:
            memo = self._filters_memo
            active = memo[1] if memo is not None and memo[0] is request else self._active_filters(request)
            split = cache[_SPLIT] = (tuple(f for _, f, sc in active if sc == "model"),
                                     tuple(f for _, f, sc in active if sc == "node"),
                                     tuple(f for _, f, sc in active if sc == "gpu"))
        pool = self.pool
        node, gpu = rec.node, rec.gpu
        mkey = (gpu.model, gpu.geometry is None)
        ok = cache.get(mkey)
        if ok is None:
            ok = cache[mkey] = all(f.check(request, node, gpu, pool) is None for f in split[0])
        if not ok:
            return False
        nkey = node.id
        ok = cache.get(nkey)
        if ok is None:
            ok = cache[nkey] = all(f.check(request, node, gpu, pool) is None for f in split[1])
        if not ok:
            return False
        for f in split[2]:
            if f.check(request, node, gpu, pool) is not None:
                return False
        return True

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
        # the built-in model-scope filters read only these request fields, and the pool's kinds never change:
        # their answer is memoised across decisions
        key = None
        if all(type(f) in _MODEL_FILTERS for f in lead):
            key = (request.models, request.min_compute_capability, request.memory_gb, request.compute_slices,
                   request.wants_whole)
            hit = self._kinds_memo.get(key)
            if hit is not None:
                if counts is not None:
                    counts.update(hit[1])
                return hit[0]
        refused: Counter[str] = Counter()
        alive = self._alive_kinds_of(request, lead, refused)
        if key is not None:
            if len(self._kinds_memo) > 4096:
                self._kinds_memo.clear()
            self._kinds_memo[key] = (alive, refused)
        if counts is not None:
            counts.update(refused)
        return alive

    def _alive_kinds_of(self, request: Request, lead: list[Filter], counts: Counter) -> set[tuple[str, bool]]:
        alive: set[tuple[str, bool]] = set()
        for kind, recs in self.pool.by_kind.items():
            rep = recs[0]
            reason = next((r for f in lead if (r := f.check(request, rep.node, rep.gpu, self.pool))), None)
            if reason is None:
                alive.add(kind)
            else:
                counts[reason] += len(recs)
        return frozenset(alive)  # type: ignore[return-value]

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
        alive = self.alive_kinds(request, counts)
        # A bucket's first refusal, composed from per-scope answers: model-scope filters answer per kind,
        # node-scope ones per node class (they read only CLASS_FIELDS here), gpu-scope ones per sig (they are
        # groupable; per (class, sig) when one also reads a node field). Each part gives its first refusing
        # filter's position; the bucket's reason is the one with the lowest position, as filter order says.
        memo = self._filters_memo
        active = memo[1] if memo is not None and memo[0] is request else self._active_filters(request)
        parts: dict[str, list[tuple[int, Filter]]] = {"model": [], "node": [], "gpu": []}
        for i, f, scope in active:
            if f.name not in per_node:
                parts[scope].append((i, f))
        gpu_by_class = any(f.node_fields for _, f in parts["gpu"])
        memo_m: dict = {}
        memo_n: dict = {}
        memo_g: dict = {}
        none = (len(self.filters), None)

        def first(fs, rec):
            for i, f in fs:
                r = f.check(request, rec.node, rec.gpu, pool)
                if r:
                    return (i, r)
            return none

        passing: dict[tuple, dict[int, None]] = {}  # buckets that pass all but the per-node-free filters
        for kind in alive:
            for key, members in pool.reason_buckets.get(kind, {}).items():
                cls, sig = key
                rm = memo_m.get(kind)
                rec = None
                if rm is None:
                    rec = pool.records[next(iter(members))]
                    rm = memo_m[kind] = first(parts["model"], rec)
                rn = memo_n.get(cls)
                if rn is None:
                    rec = rec or pool.records[next(iter(members))]
                    rn = memo_n[cls] = first(parts["node"], rec)
                gk = key if gpu_by_class else sig
                rg = memo_g.get(gk)
                if rg is None:
                    rec = rec or pool.records[next(iter(members))]
                    rg = memo_g[gk] = first(parts["gpu"], rec)
                r = rm if rm[0] < rn[0] else rn
                reason = (r if r[0] < rg[0] else rg)[1]
                if reason is not None:
                    counts[reason] += len(members)
                elif per_node:
                    rec = rec or pool.records[next(iter(members))]
                    if rec.gpu.instances or not rec.schedulable:
                        return None  # only free GPUs may reach a per-node-free filter (a custom filter set)
                    passing[key] = members
        if passing:
            last = [f for f in self.filters if f.name in per_node]
            if not self._per_node_bounded(request, last, passing, counts):
                self._per_node_buckets(request, last, passing, counts)
        return dict(counts)

    def _per_node_bounded(self, request: Request, last: list[Filter], passing: dict, counts: Counter) -> bool:
        """The per-node-free count when few nodes could pass it: "k GPUs on one node" refuses every node
        with fewer than k free schedulable GPUs (`Pool.node_free`, an upper bound on the GPUs it counts),
        so only nodes with at least k are checked; every other passing GPU takes the refusal. O(1) to
        refute (no node has k free GPUs), O(those nodes) otherwise. False: not applicable here."""
        k = request.gpu_count
        if (len(last) != 1 or not getattr(last[0], "bounded_by_node_free", False) or k <= 1
                or not all(cls[0] for cls, _ in passing)):  # offline nodes are not in node_free
            return False
        pool = self.pool
        by_free = pool.nodes_by_free
        if sum(len(ids) for c, ids in by_free.items() if c >= k) > 4 * self.max_candidates:
            return False  # many candidate nodes: the free-node buckets are cheaper
        total = sum(len(m) for m in passing.values())
        fits = 0
        f = last[0]
        for c, ids in by_free.items():
            if c < k:
                continue
            for node_id in ids:
                here = [r for r in pool.by_node[node_id] if r.bucket in passing and r.idx in passing[r.bucket]]
                if here and f.check(request, here[0].node, here[0].gpu, pool) is None:
                    fits += len(here)
        if total > fits:
            counts[f.refusal(k)] += total - fits  # type: ignore[attr-defined]
        return True

    def _per_node_buckets(self, request: Request, last: list[Filter], passing: dict, counts: Counter) -> None:
        """The per-node-free count over the pool's free-node buckets (nodes alike in class and free GPUs)."""
        pool = self.pool
        # filters that read no node field answer alike for every node with the same free GPUs
        by_free_only = all(f.node_fields == () for f in last)
        answers: dict[tuple, dict] = {}
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
            gpus = [(r.idx, r.gpu) for r in recs if self._passes(request, r, cache)]
            opt = multi_option(self.pool, recs[0].node, gpus, request) if gpus else None
            if opt is not None:
                considered += len(gpus)
                s = self.value(opt, request, weights)
                if self._better(s, opt, best):
                    best = (s, opt)
        return (best[1] if best else None), considered

    def _lists(self, request: Request) -> list[tuple[float, list[tuple[float, int]]]]:
        """Index lists that can hold a fitting GPU, each with the latency term of its region (some may be
        empty now). Memoised per request shape until the pool creates a new index list (`avail_epoch`)."""
        alive = self.alive_kinds(request)
        key = (alive, request.memory_gb, request.compute_slices, request.wants_whole, request.regions,
               request.buyer_region)
        hit = self._lists_memo.get(key)
        if hit is not None and hit[0] == self.pool.avail_epoch:
            return hit[1]
        out = self._lists_of(request, alive)
        if len(self._lists_memo) > 4096:
            self._lists_memo.clear()
        self._lists_memo[key] = (self.pool.avail_epoch, out)
        return out

    def _lists_of(self, request: Request, alive) -> list[tuple[float, list[tuple[float, int]]]]:
        pool = self.pool
        out = []
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
                    if request.regions is None or region in request.regions:
                        out.append((self._lat_term(request.buyer_region, region), lst))
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
            k = request.gpu_count
            if sum(len(ids) for c, ids in pool.nodes_by_free.items() if c >= k) <= 4 * self.max_candidates:
                # few enough: check them all, exactly (any order: ties go to the lower pool index)
                return self._nodes(request, weights, [n for c, ids in pool.nodes_by_free.items() if c >= k
                                                      for n in ids])
        lists = self._lists(request)
        # list entries are (-static key, pool index); the heap pops the highest key + latency term first
        heap = [(-(lat - lst[0][0]), n, 0) for n, (lat, lst) in enumerate(lists) if lst]
        heapq.heapify(heap)
        cache: dict = {}
        seen: set[int] = set()
        seen_nodes: set[str] = set()
        # GPUs of one node with the same sig and layout pass the same filters and give the same option and
        # score; the one with the lower pool index wins the tie, so a later twin counts as considered (the
        # budget is unchanged) without being evaluated again: (node, sig, layout) -> (pool index, passed)
        twins: dict[tuple, tuple[int, bool]] = {}
        best: tuple[float, Option] | None = None
        considered = 0
        multi = request.gpu_count > 1
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
            if multi:
                if rec.node.id in seen_nodes or pool.node_free[rec.node.id] < request.gpu_count:
                    continue
                seen_nodes.add(rec.node.id)
                gpus = [(r.idx, r.gpu) for r in pool.by_node[rec.node.id] if self._passes(request, r, cache)]
                opt = multi_option(pool, rec.node, gpus, request) if gpus else None
                considered += len(gpus) if opt else 0
            else:
                tkey = (rec.node.id, rec.sig, rec.layout)
                twin = twins.get(tkey)
                if twin is not None and twin[0] < idx:
                    considered += twin[1]
                    continue
                if not self._passes(request, rec, cache):
                    twins[tkey] = (idx, False)
                    continue
                opt = single_option(pool, rec.node, rec.gpu, request, idx=idx)
                twins[tkey] = (idx, opt is not None)
                considered += 1 if opt else 0
            if opt is not None:
                s = self.value(opt, request, weights)
                if self._better(s, opt, best):
                    best = (s, opt)
        if request.gpu_count == 1 and not request.wants_whole and self.packing_candidates:
            # the packing walk: `packing_candidates` GPUs that pass the filters (GPUs the static walk already
            # scored count too), at most 4x as many offered
            found = offered = 0
            for idx in self._best_packing(request):
                if found >= self.packing_candidates or offered >= 4 * self.packing_candidates:
                    break
                offered += 1
                rec = pool.records[idx]
                tkey = (rec.node.id, rec.sig, rec.layout)
                twin = twins.get(tkey)
                if idx in seen:
                    found += twin is not None and twin[0] == idx and twin[1]
                    continue
                seen.add(idx)
                if twin is not None and twin[0] < idx:
                    considered += twin[1]
                    found += twin[1]
                    continue
                if not self._passes(request, rec, cache):
                    twins[tkey] = (idx, False)
                    continue
                opt = single_option(pool, rec.node, rec.gpu, request, idx=idx)
                twins[tkey] = (idx, opt is not None)
                if opt is None:
                    continue
                considered += 1
                found += 1
                s = self.value(opt, request, weights)
                if self._better(s, opt, best):
                    best = (s, opt)
        return (best[1] if best else None), considered

    def _best_packing(self, request: Request):
        """GPUs best-first by an estimate of their score: − packing share × 100 × the packing cost of their
        layout bucket + static key + the region's latency term (ties: pool index), over the layout buckets
        of the kinds the request can use. A bucket's cost is its Δfrag plus the kind's waste term (the same
        for every GPU of a model), rounded to 1e-9 so that costs equal but for float rounding tie. Buckets
        are opened in cost order, only while one could still beat the best entry waiting (no static key
        exceeds `Pool.max_key`, no latency term the latency weight × 100) and until the opened buckets hold
        4 × `packing_candidates` GPUs (the caller stops by then); their region lists are merged entry by
        entry. The static walk ignores packing, so this second, short walk brings the tightest fits into the
        comparison; the caller stops it."""
        pool = self.pool
        pending: list[tuple[float, int, float, list, dict]] = []  # (next bucket's cost, n, waste, ranked, buckets)
        for n, (model, mig_off) in enumerate(sorted(self.alive_kinds(request))):
            g = pool.spec(model).mig
            if mig_off or g is None:
                continue
            p = self._fitting(model, g, request)
            if p is None:
                continue
            ranked = self._layout_rank(model, g, p.name)
            if ranked:
                waste = waste_for(pool, model, True, request, p.memory_gb)
                pending.append((_q(ranked[0][0] + waste), n, waste, ranked, pool.by_layout.get((model, p.name), {})))
        heapq.heapify(pending)
        lats = self._region_lats(request)
        wp = 100.0 * next((share for sc, share in self._cur_shares if sc.name == "packing"), 0.3)
        top = pool.max_key + DEFAULT_WEIGHTS.get("latency") * 100.0  # no static key + latency term is above
        pos = {}  # kind n -> position of its next bucket in `ranked`
        # (−estimate, pool index, position in list or −1 for an unsplit bucket, latency term, list or bucket)
        heap: list[tuple[float, int, int, float, object]] = []
        opened = 0  # GPUs in the buckets opened so far
        enough = 4 * self.packing_candidates  # the caller stops after this many: later buckets cannot matter
        while True:
            while pending and (not heap or (wp * pending[0][0] - top <= heap[0][0] and opened < enough)):
                cost, n, waste, ranked, buckets = heapq.heappop(pending)
                i = pos.get(n, 0)
                # the bucket goes in as one item, ranked by its best region list's head; it is split into
                # its region lists when it comes out on top
                head = None
                for region, lst in buckets.get(ranked[i][1], {}).items():
                    lat = lats.get(region)
                    if lat is None:
                        if request.regions is not None and region not in request.regions:
                            continue
                        lat = lats[region] = self._lat_term(request.buyer_region, region)
                    opened += len(lst)
                    h = (wp * cost + lst[0][0] - lat, lst[0][1])
                    if head is None or h < head:
                        head = h
                if head is not None:
                    heapq.heappush(heap, (head[0], head[1], -1, wp * cost, buckets[ranked[i][1]]))
                pos[n] = i + 1
                if i + 1 < len(ranked):
                    heapq.heappush(pending, (_q(ranked[i + 1][0] + waste), n, waste, ranked, buckets))
            if not heap:
                return
            _, idx, j, c, lst = heapq.heappop(heap)
            if j < 0:  # a bucket: its region lists (the one with the best head is popped next)
                for region, rl in lst.items():  # type: ignore[attr-defined]
                    lat = lats.get(region)
                    if lat is not None:
                        heapq.heappush(heap, (c + rl[0][0] - lat, rl[0][1], 0, c - lat, rl))
                continue
            # for a region list, `c` holds wp × cost − latency term: the estimate's part shared by its entries
            if j + 1 < len(lst):  # type: ignore[arg-type]
                nxt = lst[j + 1]  # type: ignore[index]
                heapq.heappush(heap, (c + nxt[0], nxt[1], j + 1, c, lst))
            yield idx

    def _region_lats(self, request: Request) -> dict[str, float]:
        """region -> the latency term of the static order, filled as regions are met (allowed ones only)."""
        key = (request.buyer_region, request.regions)
        hit = self._lats_memo.get(key)
        if hit is None:
            if len(self._lats_memo) > 256:
                self._lats_memo.clear()
            hit = self._lats_memo[key] = {}
        return hit

    def _lat_term(self, buyer_region: str | None, region: str) -> float:
        """The latency term of the static order: default latency weight × normalised RTT."""
        lk = (buyer_region, region)
        lat = self._lat_memo.get(lk)
        if lat is None:
            lat = self._lat_memo[lk] = DEFAULT_WEIGHTS.get("latency") * _LATENCY.normalise(rtt_ms(buyer_region, region))
        return lat

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


def _q(cost: float) -> float:
    """A packing cost for ordering: 1e-9 apart is a tie (a packing score difference of ~3e-8)."""
    return round(cost, 9)


def _invalid(request: Request) -> str | None:
    if request.gpu_count < 1:
        return "gpu_count must be at least 1"
    if request.memory_gb < 0 or request.compute_slices < 0:
        return "memory and compute must be >= 0"
    if request.mode not in ("reserved", "on_demand", "spot"):
        return f"unknown class {request.mode!r}"
    return None
