"""Profile choice and placement: turn (request, GPU) into a concrete option with its packing cost.

- A slice request takes the smallest MIG profile with the memory and compute asked for
  (`mig.smallest_fitting_profile`); on a GPU that is not split (no MIG, or MIG off) it takes the whole GPU.
- On a MIG GPU the start slot is the lowest legal start unless another grows Δfrag (fragmentation.py) much
  less (`fragmentation.START_TOLERANCE`).
- A whole-GPU request takes a GPU with no instances. Taking an empty MIG GPU whole for a single-GPU request
  costs the gangs it could have served (`gang_keep`: the model's demand mix for several GPUs on one node that
  a node of the pool can host, weighted by gang size): where such demand is seen, single whole GPUs go to
  non-MIG GPUs first and the MIG nodes stay whole for gangs; where it is not, an empty MIG GPU is as good as
  any (taking it whole even removes its small fragmentation), and slices fit beside other slices on part-used
  GPUs anyway. A request that could run on any model also costs the model's demand pinned to it (`pin_keep`).
- A slice that is much larger than asked for (a whole L4 for 4 GB) can cost the memory it wastes
  (`WASTE_WEIGHT`, 0 by default since issue 12 §2 round two).
- k GPUs on one node: the k free GPUs of that node with the lowest packing cost.
- A fractional share (`Request.gpu_milli`) of a GPU not in MIG mode, and in a pool given a workload
  (`Pool.use_workload`) any request on such GPUs: the GPU(s) of the node whose FGD fragmentation
  (milli_frag.node_frag, with the node's CPU and memory left) grows least (`milli_option`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from nodeagent.hardware.mig import MigGeometry

from .fragmentation import node_delta
from .milli_frag import MILLI, sigmoid_score
from .model import GpuState, NodeState, Placement, Request
from .pool import FIXED, WHOLE
from .pricing import slice_share

if TYPE_CHECKING:
    from .engine import Pool

# The keep charge on a free MIG GPU taken whole by a single-GPU request (issue 12 §2 round five, chosen on
# scheduler/sim/generalise.py's TUNE_ON, docs/simulator.md): GANG_KEEP_PER_GPU × Σ_k P(k) × k over the model's
# demand for k GPUs on one node that a node of the pool can host (Pool.gangs), so an 8-GPU gang weighs four
# times a 2-GPU one; at most NODE_TERM_WEIGHT × Σ_k P(k) (the most the node term can give back) +
# GANG_KEEP_MARGIN, so that a single taken from a node that can host no gang anyway stays inside the packing
# scorer's range (scorers.PACKING_NEUTRAL) and the node term still tells it from an empty node. Since round ten the
# charge is × `DemandMix.keep_factor`, which follows how long gangs waited (fragmentation.KEEP_RISE).
GANG_KEEP_PER_GPU = 0.375
GANG_KEEP_MARGIN = 0.25
# cost per share of a GPU's memory handed out but not asked for: 0 since issue 12 §2 round two (tuned on
# scheduler/sim/generalise.py's TUNE_ON: 0.5 lost to 0 there, with NO_ACCESS off and the fit term on)
WASTE_WEIGHT = 0.0
# The pin charge (issue 12 §2 round eight; found in round seven on scheduler/sim/generalise.py's TUNE_ON, where
# `spec30`'s pinned requests waited once the keep charge counted only gangs a node can host): an unpinned single
# whole GPU taken from a free MIG GPU pays PIN_KEEP_WEIGHT × the share of that model's demand pinned to it; since
# round twelve × how scarce the model is (`Pool.pin_scarcity`, pool.PIN_SCARCE_FROM): at ×4 load a lighter charge
# packed better, at ×8 a heavier one (round eleven), and what tells the two apart is how much of the model is taken.
PIN_KEEP_WEIGHT = 3.0
# The weight of FGD's node term (`_node_term`, fragmentation.node_delta) in the packing cost: 1 (FGD's own) until
# issue 12 §2 round eight, chosen then on scheduler/sim/generalise.py's TUNE_ON (docs/simulator.md).
NODE_TERM_WEIGHT = 0.25

Layout = tuple[tuple[str, int], ...]


@dataclass
class Option:
    """One way to serve a request: where, which profile and start, and what it costs."""

    node: NodeState
    gpus: list[GpuState]
    profile: str | None  # None = whole GPU(s)
    start: int
    pack_cost: float  # Δfrag + penalties, in shares of one GPU (averaged over the GPUs of a k-GPU option)
    price_per_hour: float
    pu: float
    idx: int = 0  # pool order of the first GPU: the deterministic tie-break
    preempt: list[str] = field(default_factory=list)
    milli: int = 0  # a fractional share per GPU (milli-GPU); 0: a MIG instance or whole GPUs

    def placements(self) -> list[Placement]:
        return [Placement(self.node.id, g.uuid, self.profile, self.start, self.milli) for g in self.gpus]


def _waste(pool: "Pool", gpu: GpuState, request: Request, slice_memory_gb: float) -> float:
    """WASTE_WEIGHT × the share of the GPU's memory handed out beyond the ask, on a MIG GPU × the share of the
    demand mix that could run there at all: memory that no other request could use is not lost."""
    return waste_for(pool, gpu.model, gpu.geometry is not None, request, slice_memory_gb)


def waste_for(pool: "Pool", model: str, mig_on: bool, request: Request, slice_memory_gb: float) -> float:
    """`_waste` for any GPU of `model` (MIG on or off): it depends on nothing else of the GPU."""
    if request.wants_whole or slice_memory_gb <= 0:
        return 0.0  # a whole GPU was asked for: nothing is handed out beyond the ask
    gpu_memory = pool.spec(model).memory_gb
    waste = WASTE_WEIGHT * max(0.0, slice_memory_gb - request.memory_gb) / gpu_memory
    if waste and mig_on:
        waste *= 1.0 - pool.mix.no_access_share(model)
    return waste


def rec_free(pool: "Pool", gpu: GpuState) -> bool:
    """The GPU holds nothing and counts among its node's free whole GPUs (schedulable)."""
    return not gpu.instances and pool.record(gpu.uuid).free_whole


def whole_cost(pool: "Pool", gpu: GpuState, request: Request) -> float:
    """Packing cost of taking `gpu` (assumed free) whole."""
    return whole_cost_for(pool, gpu.model, gpu.geometry, request)


def whole_cost_for(pool: "Pool", model: str, geometry: MigGeometry | None, request: Request) -> float:
    """`whole_cost` for any free GPU of `model` with this MIG geometry (None: not split)."""
    if geometry is None:
        return waste_for(pool, model, False, request, pool.spec(model).memory_gb)
    taken = pool.frags.whole_delta(model, geometry)
    if request.gpu_count > 1:
        return taken  # a gang is what the keep charge keeps GPUs for (its node term is in multi_option)
    # Slices fit beside others on part-used GPUs; requests for k GPUs on one node need k free ones there. So a
    # single whole GPU taken from a MIG model costs that model's demand for several that its nodes can host, and
    # one that could go anywhere costs the demand that can go only to this model.
    return taken + gang_keep(pool.gangs(model)) * pool.mix.keep_factor + pin_keep(pool, model, request)


def gang_keep(multi: Sequence[tuple[int, float]]) -> float:
    """The keep charge for (k, P(k)) gang demand: GANG_KEEP_PER_GPU × Σ P(k) × k, at most NODE_TERM_WEIGHT ×
    Σ P(k) + GANG_KEEP_MARGIN (0 without gang demand)."""
    if not multi:
        return 0.0
    mass = sum(p for _, p in multi)
    return min(GANG_KEEP_PER_GPU * sum(p * k for k, p in multi), NODE_TERM_WEIGHT * mass + GANG_KEEP_MARGIN)


def pin_keep(pool: "Pool", model: str, request: Request) -> float:
    """The pin charge on a free MIG GPU taken whole by a request that is not pinned to GPU models: PIN_KEEP_WEIGHT
    × the share of the model's demand pinned to it (`DemandMix.pinned_share`) × how scarce the model is
    (`Pool.pin_scarcity`); a pinned request pays none."""
    if request.models is not None or not PIN_KEEP_WEIGHT:
        return 0.0
    share = pool.mix.pinned_share(model)
    return PIN_KEEP_WEIGHT * share * pool.pin_scarcity(model) if share else 0.0


def list_cost(pool: "Pool", model: str, key: str, request: Request) -> float:
    """The part of the packing cost that every GPU of one index list (`Pool.avail[(model, key)]`) shares
    for `request`: the whole-GPU cost for FIXED and WHOLE lists, the memory waste of the profile for a MIG
    profile's list (its Δfrag depends on each GPU's layout). The node term is left out (it depends on the
    node's free GPUs)."""
    spec = pool.spec(model)
    if key == FIXED:
        return whole_cost_for(pool, model, None, request)
    if key == WHOLE:
        return whole_cost_for(pool, model, spec.mig, request)
    assert spec.mig is not None
    return waste_for(pool, model, True, request, spec.mig.profile(key).memory_gb)


def _node_term(pool: "Pool", node: NodeState, gpu: GpuState, taken: int) -> float:
    """FGD's node-level term for requests of k GPUs on one node (fragmentation.node_delta)."""
    if gpu.geometry is None or not pool.node_term:
        return 0.0
    return NODE_TERM_WEIGHT * node_delta(pool.mix.multi_gpu(gpu.model), pool.node_free[node.id], taken)


def single_option(pool: "Pool", node: NodeState, gpu: GpuState, request: Request, *,
                  layout: Layout | None = None, idx: int = 0, node_term: bool = True) -> Option | None:
    """The best option for `request` on one GPU (None when nothing fits), `layout` overriding the
    GPU's current MIG layout (preemption planning asks "what if these spot instances were gone").

    On the GPU's own layout the option's profile, start, packing cost and PUs depend only on the GPU's kind
    and state (sig, layout, whether it holds anything), the request's size, the node's free GPU count when
    the node term applies, and the demand mix: they are memoised per pool under that key until the mix
    refreshes (`Pool.option_memo`); the price (node price, class, the model's free share) is computed each
    time."""
    if layout is None:
        rec = pool.record(gpu.uuid)
        nf = pool.node_free[node.id] if node_term and pool.node_term and rec.free_whole and not gpu.instances else -1
        key = (rec.sig, rec.layout, not gpu.instances, request.memory_gb, request.compute_slices,
               request.wants_whole, request.profile, nf, request.gpu_count > 1, request.models is None)
        memo = pool.option_memo()
        hit = memo.get(key, False)
        if hit is False:
            opt = _single_option(pool, node, gpu, request, None, idx, node_term)
            hit = memo[key] = None if opt is None else (opt.profile, opt.start, opt.pack_cost, opt.pu,
                                                         slice_share(geometry=gpu.geometry, profile=opt.profile))
            return opt
        if hit is None:
            return None
        profile, start, cost, pu, share = hit
        price = pool.price_per_hour(base_per_gpu_hour=node.price_per_gpu_hour, share=share,
                                    mode=request.price_mode, model=gpu.model)
        return Option(node, [gpu], profile, start, cost, price, pu, idx)
    return _single_option(pool, node, gpu, request, layout, idx, node_term)


def _single_option(pool: "Pool", node: NodeState, gpu: GpuState, request: Request, layout: Layout | None,
                   idx: int, node_term: bool) -> Option | None:
    profile, reason = pool.slice_for(gpu, request)
    if reason is not None:
        return None
    if profile is None:
        if layout is None and not pool.is_free(gpu):
            return None
        start, cost = 0, whole_cost(pool, gpu, request)
        if node_term and layout is None and rec_free(pool, gpu):
            cost += _node_term(pool, node, gpu, 1)
        pu = pool.pu(gpu.model, None)
    else:
        assert gpu.geometry is not None
        lay = pool.layout(gpu) if layout is None else layout
        if layout is None and not pool.has_legal_start(gpu, profile):
            return None
        best = pool.frags.best_start(gpu.model, gpu.geometry, lay, profile)
        if best is None:
            return None
        start, delta = best
        cost = delta + _waste(pool, gpu, request, gpu.geometry.profile(profile).memory_gb)
        if node_term and layout is None and not lay and rec_free(pool, gpu):
            cost += _node_term(pool, node, gpu, 1)  # a first slice breaks a free whole GPU
        pu = pool.pu(gpu.model, profile)
    price = pool.price_per_hour(base_per_gpu_hour=node.price_per_gpu_hour,
                                share=slice_share(geometry=gpu.geometry, profile=profile),
                                mode=request.price_mode, model=gpu.model)
    return Option(node, [gpu], profile, start, cost, price, pu, idx)


def multi_option(pool: "Pool", node: NodeState, gpus: Sequence[tuple[int, GpuState]],
                 request: Request) -> Option | None:
    """k whole GPUs on `node` out of `gpus` ((pool index, GPU) pairs that passed the filters)."""
    k = request.gpu_count
    ranked = []
    for idx, g in gpus:
        opt = single_option(pool, node, g, request, idx=idx, node_term=False)
        if opt is not None and opt.profile is None:
            ranked.append((opt.pack_cost, idx, opt))
    if len(ranked) < k:
        return None
    ranked.sort(key=lambda t: (t[0], t[1]))
    chosen = [t[2] for t in ranked[:k]]
    node_cost = _node_term(pool, node, chosen[0].gpus[0], k) / k  # the option's cost is a mean per GPU
    return Option(node, [o.gpus[0] for o in chosen], None, 0,
                  sum(o.pack_cost for o in chosen) / k + node_cost, sum(o.price_per_hour for o in chosen),
                  sum(o.pu for o in chosen), min(o.idx for o in chosen))


# Δfrag of a fractional option is in milli-GPU; the packing cost counts it in shares of this many GPUs, so the
# packing curve's ±0.5 clamp (scorers.PACKING_NEUTRAL) is never reached on nodes of up to 8 GPUs
MILLI_PACK_GPUS = 16
# With a workload, Δfrag is counted in FGD's integer points (milli_frag.sigmoid_score, about this many milli a
# point): options within a point tie, and milli_path spreads ties over nodes. Measured, not derived: on the
# openb lists the exact Δ, ties to the lowest index, allocates about 0.5 point less (docs/simulator.md)
MILLI_POINT = 40.0
_NO_LIMIT = 1 << 62


def milli_option(pool: "Pool", node: NodeState, gpus: Sequence[tuple[int, GpuState]], request: Request
                 ) -> Option | None:
    """A fractional share (k = 1) or k whole GPUs on `node`, out of `gpus` ((pool index, GPU) pairs not in MIG
    mode that passed the filters and have the milli free). The packing cost is FGD's Δfrag of the node (its GPUs
    of that model, its CPU and memory left) when the pool has a workload, else the milli the GPU keeps free
    (best fit); ties go to the lower pool index."""
    m = request.gpu_milli or MILLI
    k = 1 if request.gpu_milli else request.gpu_count
    if len(gpus) < k:
        return None
    model = gpus[0][1].model
    own = [pool.record(g.uuid) for _, g in gpus if g.model == model]
    if len(own) < k:
        return None
    frag = pool.milli_frag
    if k > 1:
        chosen = sorted(own, key=lambda r: r.idx)[:k]
    elif frag is None:
        chosen = [min(own, key=lambda r: (pool.milli_free(r.gpu), r.idx))]
    else:
        chosen = None
    if frag is None:
        cost = sum(pool.milli_free(r.gpu) - m for r in chosen) / (MILLI * MILLI_PACK_GPUS)
    else:
        cpu = _NO_LIMIT if node.cpu_milli is None else node.cpu_milli - node.cpu_used
        mem = _NO_LIMIT if node.memory_mib is None else node.memory_mib - node.memory_used
        frees = {r.idx: pool.milli_free(r.gpu) for r in pool.by_node[node.id]
                 if r.gpu.model == model and r.gpu.geometry is None and r.schedulable}
        before = frag(model, tuple(sorted(frees.values())), cpu, mem)
        cpu_after, mem_after = cpu - request.cpu_milli, mem - request.memory_mib

        def delta(picked: Sequence) -> float:
            after = dict(frees)
            for r in picked:
                after[r.idx] -= m
            return frag(model, tuple(sorted(after.values())), cpu_after, mem_after) - before

        if chosen is None:
            tried: dict[int, float] = {}  # GPUs with the same milli free leave the node in the same state
            best = None
            for r in sorted(own, key=lambda r: r.idx):
                f = frees.get(r.idx, pool.milli_free(r.gpu))
                d = tried.get(f)
                if d is None:
                    d = tried[f] = delta([r])
                if best is None or d < best[0]:
                    best = (d, r)
            assert best is not None
            chosen = [best[1]]
            d = best[0]
        else:
            d = delta(chosen)
        cost = (50 - sigmoid_score(-d)) * MILLI_POINT / (MILLI * MILLI_PACK_GPUS)
    price = k * pool.price_per_hour(base_per_gpu_hour=node.price_per_gpu_hour, share=m / MILLI,
                                    mode=request.price_mode, model=model)
    pu = k * pool.pu(model, None) * m / MILLI
    return Option(node, [r.gpu for r in chosen], None, 0, cost, price, pu, min(r.idx for r in chosen),
                  milli=m if request.gpu_milli else 0)
