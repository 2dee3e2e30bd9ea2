"""The reason counting of `Scheduler` (engine.py): why a request fits nowhere, GPU by GPU.

`ReasonCounting.reasons` counts every GPU's first refusal, the same in both modes and equal to checking
every GPU, but in bulk where that is safe: per (model, MIG mode) kind, per reason bucket (node class and
GPU sig) and per free-node bucket, and otherwise per (node, sig) group.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from .filters import Filter
from .model import Request
from .pool import CLASS_FIELDS, Pool


class ReasonCounting:
    """Refusal counts of one `Scheduler` (a mixin; it uses the filter checks of filtering.py)."""

    pool: Pool
    filters: Sequence[Filter]
    max_candidates: int
    _filters_memo: tuple | None

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
