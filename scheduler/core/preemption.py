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
The search is exact per GPU: it tries every subset of the spot leases on that GPU (at most 2^7 on MIG).
"""
from __future__ import annotations

from itertools import combinations
from typing import TYPE_CHECKING

from . import mig
from .model import PlacedInstance, Request
from .placement import Option, single_option
from .pool import GpuRecord

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
    names = sorted(values)
    best = None
    for k in range(0, len(names) + 1):
        for chosen in combinations(names, k):
            gone = set(chosen)
            kept = [mig.Instance(i.profile, i.start) for i in insts  # type: ignore[arg-type]
                    if not (_preemptible(i) and i.lease_id in gone)]
            if not mig.legal_starts(geometry, kept, profile):
                continue
            cand = (sum(values[c] for c in chosen), k, chosen,
                    tuple(sorted((x.profile, x.start) for x in kept)))
            if best is None or cand[:2] < best[:2]:
                best = cand
    return best


def plan(sched: "Scheduler", request: Request, weights: "Weights") -> Option | None:
    """The cheapest preemption that makes `request` placeable, as an option whose `preempt` lists the
    spot leases to remove; None when there is none."""
    if request.mode == "spot":
        return None
    if request.gpu_count > 1:
        return _plan_multi(sched, request, weights)
    pool = sched.pool
    cache: dict = {}
    best: tuple | None = None
    for idx in sorted(pool.spot_gpus):
        rec = pool.records[idx]
        if sched.first_refusal(request, rec.node, rec.gpu, cache, skip=_SKIP) is not None:
            continue
        profile, _ = pool.slice_for(rec.gpu, request)
        removal = cheapest_removal(rec, profile)
        if removal is None or removal[1] == 0:
            continue
        value, count, leases, layout = removal
        opt = single_option(pool, rec.node, rec.gpu, request, layout=layout, idx=idx)
        if opt is None:
            continue
        opt.preempt = list(leases)
        key = (value, count, -sched.score(opt, request, weights)[0], idx)
        if best is None or key < best[0]:
            best = (key, opt)
    return best[1] if best else None


def _plan_multi(sched: "Scheduler", request: Request, weights: "Weights") -> Option | None:
    """k whole GPUs on one node, freeing spot-only GPUs on nodes that hold spot leases."""
    pool = sched.pool
    cache: dict = {}
    nodes = sorted({pool.records[i].node.id for i in pool.spot_gpus})
    best: tuple | None = None
    for node_id in nodes:
        usable: list[tuple[float, int, int, tuple[str, ...], GpuRecord]] = []
        for rec in pool.by_node[node_id]:
            if sched.first_refusal(request, rec.node, rec.gpu, cache, skip=_SKIP) is not None:
                continue
            removal = cheapest_removal(rec, None)
            if removal is not None:
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
        key = (value, len(leases), -sched.score(opt, request, weights)[0], opt.idx)
        if best is None or key < best[0]:
            best = (key, opt)
    return best[1] if best else None
