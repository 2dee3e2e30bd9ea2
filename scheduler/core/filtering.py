"""The filter side of `Scheduler` (engine.py): which GPUs a request may use.

`FilterChecks` holds the first refusal of one GPU (with per-decision caches for model- and node-scope
answers), the yes/no check the fast walks use, the filters active for a request, and the (model, MIG mode)
kinds that pass the leading model-scope filters, memoised across decisions. The reason counting
(reasons.py), the fast walks (fast_path.py) and the exhaustive reference (exhaustive.py) all build on it.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from .filters import ComputeCapability, Filter, MemoryPerSlice, ModelAllowed
from .model import GpuState, NodeState, Request
from .pool import GpuRecord, Pool

_MODEL_FILTERS = (ModelAllowed, ComputeCapability, MemoryPerSlice)
_SPLIT = object()  # key of the per-decision filter split in FilterChecks._passes' cache


class FilterChecks:
    """Filter checks of one `Scheduler` (a mixin: the state lives in `Scheduler.__init__`)."""

    pool: Pool
    filters: Sequence[Filter]
    _alive_memo: tuple | None
    _filters_memo: tuple | None
    _kinds_memo: dict[tuple, tuple]

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
            ok = cache[mkey] = _all_pass(split[0], request, node, gpu, pool)
        if not ok:
            return False
        nkey = node.id
        ok = cache.get(nkey)
        if ok is None:
            ok = cache[nkey] = _all_pass(split[1], request, node, gpu, pool)
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
                   request.wants_whole, request.profile)
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


def _all_pass(filters: tuple[Filter, ...], request: Request, node: NodeState, gpu: GpuState, pool: Pool) -> bool:
    """No filter of `filters` refuses `gpu` (a plain loop: `all(...)` over a generator costs more here)."""
    for f in filters:
        if f.check(request, node, gpu, pool) is not None:
            return False
    return True
