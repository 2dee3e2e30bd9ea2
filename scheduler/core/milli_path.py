"""The search for fractional requests (`Request.gpu_milli`), and for every request on GPUs not in MIG mode in a
pool given a workload (`Pool.use_workload`): a mixin of `Scheduler` (engine.py).

Candidates come from the pool's free-milli buckets (`Pool.milli_candidates`: only GPUs with the share free,
never a scan of the pool), grouped by node; each node's GPUs that pass the filters make one option
(placement.milli_option: FGD's Δfrag of the node), scored by the same scorers as every other option; the best
wins, ties to the lower pool index. Fast and exhaustive modes search alike here: the buckets hold exactly
the GPUs that fit.
"""
from __future__ import annotations

from .milli_frag import MILLI
from .model import Request
from .placement import Option, milli_option
from .pool import Pool
from .weights import Weights


class MilliSearch:
    pool: Pool

    def _milli_applies(self, request: Request) -> bool:
        return bool(request.gpu_milli) or (self.pool.milli_frag is not None and request.profile is None
                                           and (request.wants_whole or not self._any_mig()))

    def _any_mig(self) -> bool:
        memo = getattr(self, "_mig_memo", None)
        if memo is None or memo[0] != len(self.pool.records):
            memo = self._mig_memo = (len(self.pool.records),
                                     any(r.gpu.geometry is not None for r in self.pool.records))
        return memo[1]

    def _milli(self, request: Request, weights: Weights) -> tuple[Option | None, int]:
        pool = self.pool
        m = request.gpu_milli or MILLI
        k = 1 if request.gpu_milli else request.gpu_count
        by_node: dict[str, list] = {}
        for rec in pool.milli_candidates(m):
            by_node.setdefault(rec.node.id, []).append(rec)
        cache: dict = {}
        best: tuple[float, Option] | None = None
        considered = 0
        for recs in by_node.values():
            if len(recs) < k:
                continue
            passed = [(r.idx, r.gpu) for r in recs if self._passes(request, r, cache)]  # type: ignore[attr-defined]
            opt = milli_option(pool, recs[0].node, passed, request) if len(passed) >= k else None
            if opt is None:
                continue
            considered += len(passed)
            s = self.value(opt, request, weights)  # type: ignore[attr-defined]
            if self._better(s, opt, best):  # type: ignore[attr-defined]
                best = (s, opt)
        return (best[1] if best else None), considered
