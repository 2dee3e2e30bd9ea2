"""The search for fractional requests (`Request.gpu_milli`), and for every request on GPUs not in MIG mode in a
pool given a workload (`Pool.use_workload`): a mixin of `Scheduler` (engine.py).

Candidates come from the pool's index of node states by free-milli bucket (`Pool.milli_node_states`: only
nodes with the share free, never a scan of the pool). Nodes in one state (the same GPUs' milli free, CPU and
memory left, and node fields the filters and scorers read) score alike, so one of each (a rotation of pool
order by the lease) stands for it; its GPUs that pass the filters make one option (placement.milli_option:
FGD's Δfrag of the node), scored by the same scorers as every other option; the best wins. Ties go to
the GPU model more of the workload may use (with a workload: pods pinned to a model have fewer places to
go; on gpuspec33 the engine missed FGD by 0.8 point without it), then to `spread` (a hash of the lease and
node, drawn so that each tied node is as likely as another, whatever state it shares), not the lower pool
index: with FGD's integer points many nodes tie, and taking the first each time packs one end of the pool,
which loses about half a point of allocation on the openb lists. Scores are compared rounded to 1e-9, so
that float rounding in the sum of terms never stands in for the tie rule. Fast and exhaustive modes search
alike here: the index holds exactly the nodes that fit.
"""
from __future__ import annotations

import zlib

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
        cache: dict = {}
        frag = pool.milli_frag
        best: tuple[float, Option, tuple] | None = None
        considered = 0
        for _state, members in pool.milli_node_states(m, k):
            # every node of a state passes the same filters and scores alike: the first (pool order) decides
            # for all, unless its own GPUs' filters differ (then the next is tried)
            order = list(members)
            if len(order) > 1:  # which of a state's nodes stands for it: spread too, from a rotation of pool order
                order.sort(key=members.__getitem__)
                r = zlib.crc32(str(request.lease_id).encode()) % len(order)
                order = order[r:] + order[:r]
            for node_id in order:
                recs = [r for r in pool.by_node[node_id] if pool.milli_free(r.gpu) >= m]
                passed = [(r.idx, r.gpu) for r in recs if self._passes(request, r, cache)]  # type: ignore[attr-defined]
                opt = milli_option(pool, recs[0].node, passed, request) if len(passed) >= k else None
                if opt is None:
                    continue
                considered += len(passed)
                # rounded: scores equal but for float rounding (a price per PU computed per model) must tie, or
                # the rounding, not the tie rule, picks the model
                s = round(self.value(opt, request, weights), 9)  # type: ignore[attr-defined]
                # ties: the model more of the workload may use (pinned pods have fewer places), then spread
                tie = (-frag.mix.access_share(opt.gpus[0].model) if frag is not None else 0.0,
                       spread(request, node_id, len(order)))
                if best is None or s > best[0] or (s == best[0] and tie < best[2]):
                    best = (s, opt, tie)
                break
        return (best[1] if best else None), considered


def spread(request: Request, node_id: str, nodes: int = 1) -> float:
    """The tie-break among equal scores, least first: for `node_id` standing for a state of `nodes` nodes, the
    least of that many uniform draws, from one draw (a hash of the lease and the node) by inverse transform. So
    ties spread over the nodes evenly, as FGD's coin does, not over states: a state of 100 idle nodes is 100 times
    as likely as a lone half-used node (an even draw among states put shares on the rarer, partly used states
    and cost 0.6 point of allocation on gpuspec33), while a decision stays a function of the request and pool."""
    u = (zlib.crc32(f"{request.lease_id}:{node_id}".encode()) + 0.5) / 2 ** 32
    return 1.0 - (1.0 - u) ** (1.0 / nodes)
