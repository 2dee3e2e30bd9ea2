"""The exhaustive reference of `Scheduler` (engine.py): every filter and scorer on every GPU.

`ExhaustiveSearch._exhaustive` is what mode="exhaustive" runs; the fast walks (fast_path.py) are measured
against it (bench/decision_speed.py).
"""
from __future__ import annotations

from collections import defaultdict

from .model import GpuState, Request
from .placement import Option, multi_option, single_option
from .pool import Pool
from .weights import Weights


class ExhaustiveSearch:
    """The reference search of one `Scheduler` (a mixin; it uses filtering.py's checks and the scoring)."""

    pool: Pool

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
