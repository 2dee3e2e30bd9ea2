"""Preemption planning (DESIGN §5, §6.5): when a reserved or on-demand request fits nowhere, find the
cheapest set of SPOT leases whose removal makes a legal placement.

Rules:
- only instances of class "spot" that carry a lease id are ever removed; a GPU holding any reserved or
  on-demand instance in the way is never freed by removing those;
- spot requests never preempt (they get "unschedulable" instead);
- cheapest = least total remaining value of the removed leases, then fewest leases, then the best score of
  the placement that becomes possible, then pool order. A lease's value is counted once even when it
  spans several GPUs (its instances all carry the lease's remaining value).
- every filter except capacity still applies: a cordoned GPU or an offline node is not freed for anyone.
Per GPU and legal start slot, the leases in the way must go; when a count, compute-slice or media-engine
limit still refuses, the cheapest further spot leases on that GPU go too (greedy, so not always the
cheapest possible set in that rare case). The cheapest start wins.

Search (the same answer as trying every GPU that holds spot leases, `plan_brute_force`): a single GPU is
visited in the order of the pool's `spot_lb` index (its cheapest spot lease first, a lower bound on what
any removal there costs), and the walk stops once that bound exceeds the value of the best plan found, so
only GPUs where removing spot could still win are tried. k GPUs on one node visit only the nodes with at
least k GPUs that are free or hold only spot leases (`Pool.nodes_for_preemption`).
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from nodeagent.hardware import mig
from .model import PlacedInstance, Request
from .placement import Option, single_option
from .pool import CLASS_FIELDS, GpuRecord, node_class

if TYPE_CHECKING:
    from .engine import Scheduler
    from .weights import Weights

_SKIP = frozenset({"capacity", "gpu_count"})


def _spot_leases(instances: list[PlacedInstance]) -> dict[str, float] | None:
    """Lease -> value of the preemptible instances on a GPU."""
    out: dict[str, float] = {}
    for i in instances:
        if i.priority == "spot" and i.lease_id:
            out[i.lease_id] = max(out.get(i.lease_id, 0.0), i.remaining_value)
    return out


def _preemptible(i: PlacedInstance) -> bool:
    return i.priority == "spot" and bool(i.lease_id)


def cheapest_removal(rec: GpuRecord, profile: str | None) -> tuple[float, int, tuple[str, ...], tuple] | None:
    """(value, count, leases, layout after) of the cheapest spot removal that lets `profile` (None: the
    whole GPU) be placed on this GPU, or None when no removal of spot leases is enough."""
    insts = rec.gpu.instances
    values = _spot_leases(insts)
    if profile is None or any(i.profile is None for i in insts):
        # a whole GPU needs every instance gone; a whole-GPU allocation frees only when removed whole
        if profile is None and not all(_preemptible(i) for i in insts):
            return None
        if profile is not None and not all(_preemptible(i) for i in insts if i.profile is None):
            return None
        leases = tuple(sorted(values))
        return (sum(values.values()), len(leases), leases, ())
    geometry = rec.gpu.geometry
    assert geometry is not None
    p = geometry.profile(profile)
    best = None
    for start in p.starts:
        window = ((1 << p.memory_slices) - 1) << start
        in_way = [i for i in insts
                  if window & (((1 << geometry.profile(i.profile).memory_slices) - 1) << i.start)]  # type: ignore[arg-type]
        if not all(_preemptible(i) for i in in_way):
            continue  # a reserved or on-demand instance holds one of these slices
        gone = {i.lease_id for i in in_way}
        while True:
            kept = [i for i in insts if not (_preemptible(i) and i.lease_id in gone)]
            reason = mig.why_not(geometry, [mig.Instance(i.profile, i.start) for i in kept],  # type: ignore[arg-type]
                                 profile, start)
            if reason is None:
                break
            # count, compute or media-engine limit: free the cheapest further spot lease (greedy)
            extra = sorted((values[lease], lease) for lease in values if lease not in gone)
            if not extra:
                break
            gone.add(extra[0][1])
        if reason is not None:
            continue
        leases = tuple(sorted(gone))  # type: ignore[arg-type]
        cand = (sum(values[x] for x in leases), len(leases), leases,
                tuple(sorted((i.profile, i.start) for i in kept)))
        if best is None or cand[:2] < best[:2]:
            best = cand
    return best


def plan(sched: "Scheduler", request: Request, weights: "Weights") -> Option | None:
    """The cheapest preemption that makes `request` placeable, as an option whose `preempt` lists the
    spot leases to remove; None when there is none."""
    if request.mode == "spot":
        return None
    if request.gpu_count > 1:
        return _plan_multi(sched, request, weights,
                           sched.pool.nodes_for_preemption(request.gpu_count,
                                                           {m for m, _ in sched.alive_kinds(request)}))
    pool = sched.pool
    alive = sched.alive_kinds(request)
    lists = [pool.spot_lb[kind] for kind in sorted(alive) if pool.spot_lb.get(kind)]
    walk = heapq.merge(*lists) if len(lists) > 1 else iter(lists[0]) if lists else iter(())
    return _plan_single(sched, request, weights, walk)


def plan_brute_force(sched: "Scheduler", request: Request, weights: "Weights") -> Option | None:
    """The reference `plan`: every GPU holding spot leases, every node (the tests compare the two)."""
    if request.mode == "spot":
        return None
    if request.gpu_count > 1:
        return _plan_multi(sched, request, weights, list(sched.pool.by_node))
    alive = sched.alive_kinds(request)
    pool = sched.pool
    walk = ((0.0, idx) for idx in sorted(pool.spot_gpus)
            if (pool.records[idx].gpu.model, pool.records[idx].gpu.geometry is None) in alive)
    return _plan_single(sched, request, weights, walk)


def _plan_single(sched: "Scheduler", request: Request, weights: "Weights", walk) -> Option | None:
    """The cheapest plan over `walk`: (lower bound on removal value, pool index) pairs, bound ascending."""
    pool = sched.pool
    cache: dict = {}
    best: tuple | None = None
    for lb, idx in walk:
        if best is not None and lb > best[0][0]:
            break  # every GPU left costs more than the best plan found
        rec = pool.records[idx]
        if sched.first_refusal(request, rec.node, rec.gpu, cache, skip=_SKIP) is not None:
            continue
        profile, _ = pool.slice_for(rec.gpu, request)
        removal = cheapest_removal(rec, profile)
        if removal is None or removal[1] == 0:
            continue
        value, count, leases, layout = removal
        if best is not None and (value, count) > best[0][:2]:
            continue
        opt = single_option(pool, rec.node, rec.gpu, request, layout=layout, idx=idx)
        if opt is None:
            continue
        opt.preempt = list(leases)
        key = (value, count, -sched.value(opt, request, weights), idx)
        if best is None or key < best[0]:
            best = (key, opt)
    return best[1] if best else None


def _plan_multi(sched: "Scheduler", request: Request, weights: "Weights", nodes: list[str]) -> Option | None:
    """k whole GPUs on one node, freeing spot-only GPUs on nodes that hold spot leases."""
    pool = sched.pool
    cache: dict = {}
    alive = sched.alive_kinds(request)
    best: tuple | None = None
    node_ok: dict = {}  # node class -> its node-scope filters pass (they read only the class fields)
    node_filters = [f for f in sched.filters if f.scope == "node" and f.name not in _SKIP and f.active(request)
                    and f.node_fields is not None and set(f.node_fields) <= set(CLASS_FIELDS)]
    for node_id in nodes:
        usable: list[tuple[float, int, int, tuple[str, ...], GpuRecord]] = []
        recs = pool.by_node[node_id]
        if len(recs) < request.gpu_count or not any(r.idx in pool.spot_gpus for r in recs):
            continue
        if not any((r.gpu.model, r.gpu.geometry is None) in alive for r in recs):
            continue  # cheap refusals first: no GPU of an allowed kind, or the node's class is refused
        cls = node_class(recs[0].node)
        ok = node_ok.get(cls)
        if ok is None:
            ok = node_ok[cls] = all(f.check(request, recs[0].node, recs[0].gpu, pool) is None for f in node_filters)
        if not ok:
            continue
        if sum(1 for r in recs if all(_preemptible(i) for i in r.gpu.instances)) < request.gpu_count:
            continue  # not enough GPUs that are free or hold only spot leases
        for rec in recs:
            if (rec.gpu.model, rec.gpu.geometry is None) not in alive:
                continue
            removal = cheapest_removal(rec, None)
            if removal is None:
                continue
            if sched.first_refusal(request, rec.node, rec.gpu, cache, skip=_SKIP) is None:
                usable.append((removal[0], removal[1], rec.idx, removal[2], rec))
        if len(usable) < request.gpu_count:
            continue
        usable.sort(key=lambda t: (t[0], t[1], t[2]))
        chosen = usable[:request.gpu_count]
        leases = sorted({lease for c in chosen for lease in c[3]})
        if not leases:
            continue  # it would have fitted without preemption
        value = 0.0
        for lease in leases:
            value += max(i.remaining_value for c in chosen for i in c[4].gpu.instances if i.lease_id == lease)
        parts = [single_option(pool, c[4].node, c[4].gpu, request, layout=(), idx=c[2]) for c in chosen]
        if any(p is None for p in parts):
            continue
        opt = Option(parts[0].node, [p.gpus[0] for p in parts], None, 0,  # type: ignore[union-attr]
                     sum(p.pack_cost for p in parts) / len(parts),  # type: ignore[union-attr]
                     sum(p.price_per_hour for p in parts), sum(p.pu for p in parts),  # type: ignore[union-attr]
                     chosen[0][2], preempt=leases)
        key = (value, len(leases), -sched.value(opt, request, weights), opt.idx)
        if best is None or key < best[0]:
            best = (key, opt)
    return best[1] if best else None
