"""The fast path of `Scheduler` (engine.py): candidate walks over the pool's indexes.

`FastSearch._fast` walks the availability index (GPUs where the needed profile has a legal start, per
model and region) best estimate first — static node key (the spot key, with the interruption term, for spot
requests), latency term, minus the packing share × the packing cost the list's GPUs share and, for free
MIG GPUs, their node term — until `max_candidates` GPUs passed the filters; then a short packing walk
(`_best_packing`: layout buckets in order of packing cost, and for a slice the free GPUs that are not
split as one bucket per model at their list's cost, GPUs in the same estimate order) brings the tightest
fits into the comparison; k-GPU requests check whole nodes (`_nodes`). Every term the scorers
weigh is in one of the two orders, which is what keeps the fast choice within 1% of the exhaustive one
with small budgets (bench/decision_speed.py, tests/core/test_fast_agreement.py). It holds the memos these
walks use: index lists per request shape, fitting profiles, latency terms and layout ranks.
"""
from __future__ import annotations

import heapq

from nodeagent.hardware import mig
from .model import Request
from . import placement as placement_module
from .placement import Option, _node_term, list_cost, multi_option, single_option, waste_for
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

    def _lists(self, request: Request, wp: float) -> tuple[list, list[float], list[float], list[tuple]]:
        """Index lists that can hold a fitting GPU, each with the latency term of its region and the packing
        cost every GPU of the list shares (`list_cost`), its model and key (some may be empty now); then each
        list's offset in the static walk's estimate for packing share × 100 `wp` (latency term − wp × (cost +
        the lowest node term of a WHOLE list's GPUs)), that lowest node term, and (offset, position, list)
        per list. Memoised per request shape, and per shape and regions, until the pool creates a new index
        list (`avail_epoch`) or the demand mix is refreshed (offsets per `wp`, which moves with load): the
        walk's fixed cost per decision is then only its heap."""
        alive = self.alive_kinds(request)
        multi = request.gpu_count > 1
        shape = (alive, request.memory_gb, request.compute_slices, request.wants_whole, request.profile,
                 request.mode == "spot", multi, request.models is None)  # pinning: placement.pin_keep
        key = shape + (request.regions, request.buyer_region)
        memo = self._lists_memo
        hit = memo.get(key)
        pool = self.pool
        stamp = (pool.avail_epoch, pool.mix.version, pool.node_term)
        if hit is None or hit[0] != stamp:
            if len(memo) > 4096:
                memo.clear()
            # two levels: the lists of a shape (any region), then the request's regions and latency terms
            every = memo.get(shape)
            if every is None or every[0] != stamp:
                every = memo[shape] = (stamp, self._lists_of(request, alive))
            regions, buyer, lat_term = request.regions, request.buyer_region, self._lat_term
            hit = memo[key] = [stamp, [(lat_term(buyer, region), cost, lst, model, k)
                                       for region, cost, lst, model, k in every[1]
                                       if regions is None or region in regions], None, None, None, None]
        if hit[2] != wp:
            # a WHOLE list's GPUs also pay the node term, which depends on their node's free GPUs: the list
            # is ranked by the lowest node term any node can have (`_fast` puts each GPU back at its own)
            if hit[4] is None:
                hit[4] = [0.0 if multi or k != WHOLE else self._node_term_lb(model) for *_, model, k in hit[1]]
            hit[3] = [lat - wp * (cost + lb) for (lat, cost, *_), lb in zip(hit[1], hit[4])]
            hit[5] = [(off, n, lists[2]) for n, (off, lists) in enumerate(zip(hit[3], hit[1]))]
            hit[2] = wp
        return hit[1], hit[3], hit[4], hit[5]

    def _lists_of(self, request: Request, alive) -> list[tuple[str, float, list[tuple[float, int]], str, str]]:
        """(region, packing cost, list, model, key) of every index list a request of this shape can use,
        in any region."""
        pool = self.pool
        avail = pool.avail_spot if request.mode == "spot" else pool.avail  # the order the request is scored in
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
                cost = list_cost(pool, model, key, request)
                out.extend((region, cost, lst, model, key) for region, lst in avail.get((model, key), {}).items())
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
        # list entries are (-static key, pool index); the heap pops the highest static key + latency term −
        # packing share × the list's packing cost first
        wp = 100.0 * next((share for sc, share in self._cur_shares if sc.name == "packing"), 0.3)
        lists, offsets, nt_lbs, firsts = self._lists(request, wp)
        multi = request.gpu_count > 1
        # a WHOLE list is ranked by the lowest node term any node can have, and each GPU is put back at its
        # own when it comes out (`_node_term_lb`), so the walk still takes GPUs in estimate order
        heap: list[tuple] = [(lst[0][0] - off, n, 0) for off, n, lst in firsts if lst]
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
        while heap and considered < self.max_candidates:
            item = heapq.heappop(heap)
            n, pos = item[1], item[2]
            lst = lists[n][2]
            if pos < 0:  # a GPU put back at its own node term
                idx = item[3]
            else:
                if pos + 1 < len(lst):
                    heapq.heappush(heap, (lst[pos + 1][0] - offsets[n], n, pos + 1))
                idx = lst[pos][1]
                if nt_lbs[n]:
                    rec = pool.records[idx]
                    extra = wp * (_node_term(pool, rec.node, rec.gpu, 1) - nt_lbs[n])
                    if extra > 0:
                        heapq.heappush(heap, (item[0] + extra, n, -1, idx))
                        continue
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
        layout bucket + static key (the spot key for spot requests) + the region's latency term (ties: pool
        index), over the layout buckets of the kinds the request can use; the free GPUs of a model that is not
        split (no MIG, or MIG off) with the memory asked are one more bucket, at their list's cost (`list_cost`:
        the slice takes the whole GPU, with no Δfrag), so a free L4 is weighed beside part-used MIG GPUs. A
        bucket's cost is its Δfrag plus the kind's waste term (the same for every GPU of a model), rounded to
        1e-9 so that costs equal but for float rounding tie. Each kind's buckets are opened in cost order while
        one could still beat the best item waiting (no key of the model exceeds `Pool.model_max_key`, no latency
        term the request's best region's); an opened bucket waits as one item, bounded by its best key over its
        regions (`Pool.layout_head`) and the best latency term, and is split into its region lists, merged entry
        by entry, when it comes out on top. Equally good buckets are therefore all weighed, however many there
        are, and the GPUs come out in exact estimate order. The static walk ignores Δfrag, so this second, short
        walk brings the tightest fits into the comparison; the caller stops it."""
        pool = self.pool
        spot = request.mode == "spot"
        by_layout = pool.by_layout_spot if spot else pool.by_layout
        all_heads = pool.layout_head_spot if spot else pool.layout_head
        lats = self._region_lats(request)
        wp = 100.0 * next((share for sc, share in self._cur_shares if sc.name == "packing"), 0.3)
        top_keys = pool.model_max_skey if spot else pool.model_max_key
        lat_top = self._max_lat(request)
        # (−the best estimate any GPU of the kind's next bucket can have, n, its cost, waste, ranked, buckets,
        # their heads, the kind's highest key + latency term)
        pending: list[tuple] = []
        model_of: dict[int, str] = {}
        avail = pool.avail_spot if spot else pool.avail
        for n, (model, mig_off) in enumerate(sorted(self.alive_kinds(request))):
            g = pool.spec(model).mig
            if mig_off or g is None:
                # a GPU that is not split takes the slice whole: one bucket at the list's cost (its waste), so
                # a free L4 is weighed beside part-used MIG GPUs that pay Δfrag and the fit term
                lists = avail.get((model, FIXED))
                heads = [lst[0][0] for lst in lists.values() if lst] if lists else None
                if heads and pool.spec(model).memory_gb >= request.memory_gb:
                    cost = list_cost(pool, model, FIXED, request)
                    top = top_keys[model] + lat_top
                    pending.append((wp * cost - top, n, cost, 0.0, [(cost, FIXED)], {FIXED: lists},
                                    {FIXED: min(heads)}, top))
                    model_of[n] = model
                continue
            p = self._fitting(model, g, request)
            if p is None:
                continue
            ranked = self._layout_rank(model, g, p.name)
            if ranked:
                waste = waste_for(pool, model, True, request, p.memory_gb)
                top = top_keys[model] + lat_top
                cost = ranked[0][0] + waste
                pending.append((wp * cost - top, n, cost, waste, ranked, by_layout.get((model, p.name), {}),
                                all_heads.get((model, p.name), {}), top))
                model_of[n] = model
        heapq.heapify(pending)
        push, pop = heapq.heappush, heapq.heappop
        pos = {}  # kind n -> position of its next bucket in `ranked`
        # (−estimate, pool index (−1 − a count for a bucket), position in list (−1 for a bucket, −2 for a GPU
        #  put back at its own node term), wp × cost [− latency term for a region list], list or bucket,
        #  wp × the lowest node term the entries were ranked at (the empty layout's bucket) or 0)
        heap: list[tuple[float, int, int, float, object, float]] = []
        opened = 0
        while True:
            while pending and (not heap or pending[0][0] <= heap[0][0]):
                _, n, cost, waste, ranked, buckets, heads, top = pop(pending)
                i = pos.get(n, 0)
                n_ranked = len(ranked)
                head_of = heads.get
                # this kind's buckets in cost order, for as long as they could beat the best item waiting
                while True:
                    layout = ranked[i][1]
                    head = head_of(layout)
                    if head is not None:
                        opened += 1
                        wc = wp * cost
                        push(heap, (wc + head - lat_top, -opened, -1, wc, buckets[layout],
                                    wp * self._node_term_lb(model_of[n]) if not layout else 0.0))
                    i += 1
                    if i == n_ranked:
                        break
                    cost = ranked[i][0] + waste
                    if heap and wp * cost - top > heap[0][0]:
                        push(pending, (wp * cost - top, n, cost, waste, ranked, buckets, heads, top))
                        break
                pos[n] = i
            if not heap:
                return
            est, idx, j, c, lst, nt = pop(heap)
            if j == -1:  # a bucket: its region lists (the one with the best head is popped next)
                for region, rl in lst.items():  # type: ignore[attr-defined]
                    if not rl:
                        continue  # an index list of FIXED GPUs stays when its last GPU is taken
                    lat = lats.get(region)
                    if lat is None:
                        if request.regions is not None and region not in request.regions:
                            continue
                        lat = lats[region] = self._lat_term(request.buyer_region, region)
                    push(heap, (c + rl[0][0] - lat, rl[0][1], 0, c - lat, rl, nt))
                continue
            if j >= 0:
                # for a region list, `c` holds wp × cost − latency term: the estimate's part shared by its entries
                if j + 1 < len(lst):  # type: ignore[arg-type]
                    nxt = lst[j + 1]  # type: ignore[index]
                    push(heap, (c + nxt[0], nxt[1], j + 1, c, lst, nt))
                if nt:  # the empty bucket, ranked at the lowest node term: back in at the GPU's own
                    rec = pool.records[idx]
                    extra = wp * _node_term(pool, rec.node, rec.gpu, 1) - nt
                    if extra > 0:
                        push(heap, (est + extra, idx, -2, 0.0, None, 0.0))
                        continue
            yield idx

    def _max_lat(self, request: Request) -> float:
        """No region the request allows has a higher latency term in the static order than this: the buyer's
        own region (any region when the buyer's is unknown), or the best of the allowed ones."""
        regions = (request.buyer_region,) if request.regions is None else request.regions
        return max((self._lat_term(request.buyer_region, r) for r in regions if r is not None),
                   default=self._lat_term(None, ""))

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

    def _node_term_lb(self, model: str) -> float:
        """No free GPU of `model` pays a lower node term than this (fragmentation.node_delta of one GPU: at
        least − P(k) for every k of the k-GPU demand), 0 where the pool leaves the node term out."""
        if not self.pool.node_term:
            return 0.0
        return -placement_module.NODE_TERM_WEIGHT * sum(p for _, p in self.pool.mix.multi_gpu(model))

    def _layout_rank(self, model: str, g: mig.MigGeometry, profile: str) -> list[tuple[float, tuple]]:
        """Layouts holding GPUs where `profile` fits, by Δfrag of placing it (for the empty layout, plus the
        lowest node term: its GPUs are free whole GPUs); cached until a layout bucket comes or goes or the
        demand mix is refreshed."""
        pool = self.pool
        key = (model, profile)
        stamp = (pool.layout_epoch[key], pool.mix.version, pool.node_term)
        hit = self._rank_cache.get(key)
        if hit is None or hit[0] != stamp:
            ranked = []
            for layout in pool.by_layout.get(key, {}):
                best = pool.frags.best_start(model, g, layout, profile)
                if best is not None:
                    ranked.append((_q(best[1] + (0.0 if layout else self._node_term_lb(model))), layout))
            ranked.sort()
            hit = self._rank_cache[key] = (stamp, ranked)
        return hit[1]


def _q(cost: float) -> float:
    """A packing cost for ordering: 1e-9 apart is a tie (a packing score difference of ~3e-8)."""
    return round(cost, 9)
