"""The fast path of `Scheduler` (engine.py): candidate walks over the pool's indexes.

`FastSearch._fast` walks the availability index (GPUs where the needed profile has a legal start, per
model and region, best static node key + latency term first) until `max_candidates` GPUs passed the
filters, then a short packing walk (`_best_packing`: layout buckets in order of packing cost) brings the
tightest fits into the comparison; k-GPU requests check whole nodes (`_nodes`). It holds the memos these
walks use: index lists per request shape, fitting profiles, latency terms and layout ranks.
"""
from __future__ import annotations

import heapq

from nodeagent.hardware import mig
from .model import Request
from .placement import Option, multi_option, single_option, waste_for
from .pool import FIXED, WHOLE, GpuRecord, Pool
from .regions import rtt_ms
from .scorers import LatencyScorer, Scorer
from .weights import DEFAULT_WEIGHTS, Weights

_LATENCY = LatencyScorer()


class FastSearch:
    """The candidate walks of one `Scheduler` (a mixin; it uses filtering.py's checks and the scoring)."""

    pool: Pool
    max_candidates: int
    packing_candidates: int
    _cur_shares: list[tuple[Scorer, float]]
    _rank_cache: dict[tuple[str, str], tuple[tuple[int, int], list]]
    _fit_memo: dict[tuple, mig.MigProfile | None]
    _lat_memo: dict[tuple, float]
    _lats_memo: dict[tuple, dict[str, float]]
    _lists_memo: dict[tuple, tuple]

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
        key = (alive, request.memory_gb, request.compute_slices, request.wants_whole, request.profile,
               request.regions, request.buyer_region)
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
        """`mig.smallest_fitting_profile` for the request's memory and compute (or its pinned profile),
        memoised per model."""
        if request.profile is not None:
            return g.profile(request.profile) if g.has_profile(request.profile) else None
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
