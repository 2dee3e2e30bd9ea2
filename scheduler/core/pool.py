"""The mutable, indexed pool the scheduler decides against (re-exported by engine.py as `engine.Pool`).

Indexes, all maintained per GPU on every change (allocate, release, health, node online/price):
- `avail[(model, key)][region]`: GPUs where `key` can be placed now, sorted best-first by a static node
  key (price per PU and reliability under the default weights). `key` is a MIG profile name (a legal start
  exists now), WHOLE (an empty MIG GPU) or FIXED (a free GPU that is not split: no MIG, or MIG off).
  Only schedulable GPUs are indexed: node online and GPU not cordoned.
- `by_layout[(model, profile)][layout][region]`: the same GPUs bucketed by MIG layout, which fixes their
  Δfrag, and by region (the latency term), so the fast path can also visit the best-packing GPUs;
- `layout_head[(model, profile)][layout]` (and `layout_head_spot`): a bucket's best entry over its regions;
- `avail_spot` and `by_layout_spot`: the same two in spot order (the static key plus the interruption term
  under the default weights, `GpuRecord.skey`), for spot requests, the only ones scored on interruptions;
- free share per model (sum of free fractions / schedulable GPUs), kept as running sums;
- free whole GPUs per node, GPUs holding spot instances, and lease id -> GPUs;
- reason buckets, so that `Scheduler.reasons` costs O(buckets), not O(GPUs): `reason_buckets[(model, MIG
  off)][(node class, GPU sig)]` = the GPUs whose nodes share the node fields filters read (`CLASS_FIELDS`: online, region, CUDA, containers)
  and that share model, MIG mode, health and placeable profiles, so every groupable filter that reads no
  other node field answers them alike; `free_nodes[(node class, free sig)]` = nodes with the same class and
  the same free GPUs (by sig), which `GpusOnOneNode` answers alike (`free_nodes[class][free sig]`; nodes
  with no free GPU are left out);
- spot capacity for preemption: `spot_lb[(model, MIG off)]` = GPUs holding spot leases, sorted by their
  cheapest spot lease (a lower bound on the value any removal there costs), and nodes by how many of their
  GPUs are free or hold only spot (`nodes_by_pfree`, and per the node's model in `nodes_by_kind_pfree`),
  for k-GPU preemption.
- fractional shares (GPUs not in MIG mode shared by milli, model.Request.gpu_milli): `milli_index[bucket]` =
  schedulable non-MIG GPUs with free milli in [100·bucket, 100·bucket + 99] (bucket 10: wholly free), so a
  request for m milli visits buckets m // 100 and up, never the whole pool; `milli_frag` (set by
  `use_workload`) is FGD's measure placement.milli_option scores with; node CPU and memory in use are kept
  on `NodeState.cpu_used` / `memory_used` from the instances' `cpu_milli` / `memory_mib`.
Also `max_key` and `max_skey` (upper bounds on every static and spot key), `avail_epoch` (bumps when an `avail` list is created:
the scheduler memoises which lists serve a request shape) and `option_memo()` (placement.single_option's
per-layout costs, for one demand-mix version).
A `Pool` deep-copies the `NodeState`s it is given (callers keep their snapshot, the pool owns its copy)
unless told `copy=False` by a caller that built them for it alone (the Django side's snapshots).
Prices go through `price_per_hour`: the pool's `PriceRules` (pricing.py) and, for spot, the factor the
market recorded per model (`spot_factors`) or else the one the model's free share gives.
"""
from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from contextlib import contextmanager
from copy import deepcopy
from typing import Iterable, Iterator

from nodeagent.hardware import mig

from . import perf
from .fragmentation import DemandMix, FragCache
from .milli_frag import MILLI, FragTable, WorkloadMix
from nodeagent.hardware.gpus import GPU_MODELS, GpuModelSpec
from .model import Decision, GpuState, NodeState, PlacedInstance, Request
from .pricing import DEFAULT_RULES, PriceRules
from .scorers import InterruptionScorer, PriceScorer, ReliabilityScorer
from .weights import DEFAULT_WEIGHTS

WHOLE, FIXED = "__whole__", "__fixed__"
CLASS_FIELDS = ("online", "region", "cuda_version", "runs_containers", "image_allowlist")  # what reason buckets group by


def node_class(node: NodeState) -> tuple:
    return (node.online, node.region, node.cuda_version, node.runs_containers, node.image_allowlist)


def _preemptible(i: PlacedInstance) -> bool:
    return i.priority == "spot" and bool(i.lease_id)


class CapacityError(ValueError):
    """An allocation that the pool's current state does not allow (a stale or foreign decision)."""


class GpuRecord:
    __slots__ = ("gpu", "node", "idx", "spec", "layout", "avail", "free_frac", "key", "skey", "keyed", "schedulable",
                 "free_whole", "region", "leases", "sig", "bucket", "spot_lb", "pfree", "has_spot")

    def __init__(self, gpu: GpuState, node: NodeState, idx: int) -> None:
        self.gpu, self.node, self.idx = gpu, node, idx
        self.spec: GpuModelSpec = GPU_MODELS[gpu.model]
        self.layout: tuple[tuple[str, int], ...] = ()
        self.avail: frozenset[str] = frozenset()
        self.free_frac = 0.0
        self.key = 0.0
        self.skey = 0.0  # the static key plus the default-weighted interruption term: the order for spot
        self.keyed = False
        self.schedulable = False
        self.free_whole = False
        self.region = node.region
        self.leases: frozenset[str] = frozenset()
        self.sig: tuple | None = None
        self.bucket: tuple | None = None  # key in Pool.reason_buckets
        self.spot_lb: float | None = None  # cheapest spot lease on the GPU (None: holds no spot lease)
        self.pfree = False  # every instance (if any) is preemptible spot: removal can free the whole GPU
        self.has_spot = False


# How scarce a MIG model is for the demand pinned to it (`Pool.pin_scarcity`, which scales placement.pin_keep; issue
# 12 §2 round twelve, chosen on the pinned tuning families `spec30` and `mixed-t`, docs/simulator.md): 0 while no more
# than PIN_SCARCE_FROM of the model's capacity is taken, rising linearly to 1 when all of it is. The level the costs
# see moves only once the live value is PIN_SCARCE_STEP away from it: each move bumps the demand mix's version (every
# cost memoised by it is renewed), and a model whose use sits at a boundary does not renew them on every placement.
PIN_SCARCE_FROM = 0.2
PIN_SCARCE_STEP = 0.05


class Pool:
    """Pool state built from `NodeState`s; see the module docstring for what it indexes."""

    def __init__(self, nodes: Iterable[NodeState], *, mix: DemandMix | None = None,
                 rules: PriceRules = DEFAULT_RULES, spot_factors: dict | None = None, copy: bool = True) -> None:
        self.rules = rules
        self.spot_factors = dict(spot_factors or {})  # model -> recorded spot factor (Decimal)
        self._static_factors = {m: float(rules.factor(m)) for m in ("on_demand", "reserved", "reserved_short_notice")}
        self.nodes: dict[str, NodeState] = {}
        self.records: list[GpuRecord] = []
        self._by_uuid: dict[str, GpuRecord] = {}
        self.by_model: dict[str, list[GpuRecord]] = defaultdict(list)
        self.by_node: dict[str, list[GpuRecord]] = defaultdict(list)
        self.by_kind: dict[tuple[str, bool], list[GpuRecord]] = defaultdict(list)  # (model, MIG off)
        # node -> signature -> pool indexes: GPUs of a node that every groupable filter treats alike
        self.node_groups: dict[str, dict[tuple, dict[int, None]]] = defaultdict(dict)
        self.avail: dict[tuple[str, str], dict[str, list[tuple[float, int]]]] = defaultdict(
            lambda: defaultdict(list))
        # (model, MIG profile) -> layout -> region -> GPUs with that layout where the profile fits, static key
        # order: every GPU in a bucket has the same Δfrag for the profile (fragmentation.FragCache)
        self.by_layout: dict[tuple[str, str], dict[tuple, dict[str, list[tuple[float, int]]]]] = defaultdict(dict)
        self.layout_epoch: dict[tuple[str, str], int] = defaultdict(int)  # bumps when a bucket comes or goes
        # the same two indexes in spot order (`GpuRecord.skey`: the static key plus the interruption term, which
        # only spot requests are scored on), so a spot request's walks meet reliable nodes first
        self.avail_spot: dict[tuple[str, str], dict[str, list[tuple[float, int]]]] = defaultdict(
            lambda: defaultdict(list))
        self.by_layout_spot: dict[tuple[str, str], dict[tuple, dict[str, list[tuple[float, int]]]]] = defaultdict(dict)
        # the best entry of each layout bucket over its regions: (model, profile) -> layout -> -highest key
        self.layout_head: dict[tuple[str, str], dict[tuple, float]] = defaultdict(dict)
        self.layout_head_spot: dict[tuple[str, str], dict[tuple, float]] = defaultdict(dict)
        self.max_key = float("-inf")  # no GPU's static key was ever above this (an upper bound, never lowered)
        self.max_skey = float("-inf")  # the same for the spot key
        self.model_max_key: dict[str, float] = {}  # the same per GPU model
        self.model_max_skey: dict[str, float] = {}
        self.avail_epoch = 0  # bumps when an `avail` list is created (lists are never removed)
        self._free_sum: dict[str, float] = defaultdict(float)
        self._cap: dict[str, int] = defaultdict(int)
        self.node_free: dict[str, int] = defaultdict(int)
        self.nodes_by_free: dict[int, set[str]] = defaultdict(set)  # free GPU count -> nodes
        self.spot_gpus: set[int] = set()
        self.leases: dict[str, set[int]] = defaultdict(set)
        # (model, MIG off) -> (node class, sig) -> pool indexes
        self.reason_buckets: dict[tuple[str, bool], dict[tuple, dict[int, None]]] = defaultdict(dict)
        self.free_nodes: dict[tuple, dict[tuple, dict[str, None]]] = {}  # class -> free sig -> nodes
        self._node_fkey: dict[str, tuple] = {}
        self.spot_lb: dict[tuple[str, bool], list[tuple[float, int]]] = defaultdict(list)
        self.node_pfree: dict[str, int] = defaultdict(int)  # GPUs free or holding only spot leases
        self.node_spot: dict[str, int] = defaultdict(int)  # GPUs holding spot leases
        self.nodes_by_pfree: dict[int, set[str]] = defaultdict(set)
        # the same per (the node's only GPU model, or None for a node with several models; count)
        self.nodes_by_kind_pfree: dict[tuple, set[str]] = defaultdict(set)
        self._tags: dict[str, str | None] = {}
        self.mix = mix or DemandMix()
        self.node_term = True  # FGD's node-level term for k-GPU demand in packing costs (placement.py)
        self.frags = FragCache(self.mix)
        self._slice_cache: dict[tuple, tuple[str | None, str | None]] = {}
        self._avail_cache: dict[tuple, frozenset[str]] = {}
        self._pu_cache: dict[tuple[str, str | None], float] = {}
        self._opt_memo: dict[tuple, tuple | None] = {}
        self._opt_stamp: tuple | None = None
        self.milli_index: dict[int, dict[int, None]] = defaultdict(dict)  # free-milli bucket -> pool indexes
        self._milli_bucket: dict[int, int] = {}  # pool index -> its bucket
        self.milli_frag: FragTable | None = None  # FGD's measure with the workload (use_workload); None: best fit
        self._pin_level: dict[str, float] = {}  # model -> its pin_scarcity level, once asked (followed from then on)
        self.host_held: dict[str, tuple[int, int]] = {}  # node -> CPU, memory held by work on no GPU (hold_host)
        # nodes by fractional state: the most milli free on one GPU (bucket) -> state -> nodes (pool order of
        # their first GPU). Nodes in one state pass the same filters and score the same (`milli_state`)
        self.milli_states: dict[int, dict[tuple, dict[str, int]]] = defaultdict(dict)
        self._node_mstate: dict[str, tuple[int, tuple]] = {}
        for node in nodes:
            if copy:
                node = deepcopy(node)
            if node.id in self.nodes:
                raise ValueError(f"node {node.id!r} appears twice")
            self.nodes[node.id] = node
            for gpu in node.gpus:
                if gpu.uuid in self._by_uuid:
                    raise ValueError(f"GPU {gpu.uuid!r} appears twice")
                if gpu.model not in GPU_MODELS:
                    raise ValueError(f"GPU {gpu.uuid!r}: unknown model {gpu.model!r}")
                gpu.node_id = node.id
                rec = GpuRecord(gpu, node, len(self.records))
                self.records.append(rec)
                self._by_uuid[gpu.uuid] = rec
                self.by_model[gpu.model].append(rec)
                self.by_node[node.id].append(rec)
                self.by_kind[(gpu.model, gpu.geometry is None)].append(rec)
                self._refresh(rec)
        # model -> the most GPUs of it on one node: a request for more on one node can never run here
        self.most_on_a_node: dict[str, int] = {}
        for node_id, recs in self.by_node.items():
            per_model = Counter(rec.gpu.model for rec in recs)
            for model, n in per_model.items():
                self.most_on_a_node[model] = max(n, self.most_on_a_node.get(model, 0))
        self._gangs: dict[str, tuple[tuple[int, float], ...]] = {}
        self._gangs_version = -1

    # --- what filters and scorers ask (filters.PoolView) -----------------------------------------------

    def spec(self, model: str) -> GpuModelSpec:
        return GPU_MODELS[model]

    def gpu(self, uuid: str) -> GpuState:
        return self._by_uuid[uuid].gpu

    def record(self, uuid: str) -> GpuRecord:
        return self._by_uuid[uuid]

    def slice_for(self, gpu: GpuState, request: Request) -> tuple[str | None, str | None]:
        """(MIG profile or None for a whole GPU, None or the reason this GPU cannot offer the slice)."""
        whole = request.wants_whole
        key = (gpu.model, gpu.geometry is None, request.memory_gb, request.compute_slices, whole, request.profile,
               request.gpu_milli > 0)
        hit = self._slice_cache.get(key)
        if hit is None:
            spec = GPU_MODELS[gpu.model]
            if request.gpu_milli and gpu.geometry is not None:
                hit = (None, "MIG mode on (no milli shares)")
            elif request.profile is not None and not whole:
                ok = gpu.geometry is not None and gpu.geometry.has_profile(request.profile)
                hit = (request.profile, None) if ok else (None, f"no {request.profile} slice")
            elif whole or gpu.geometry is None:
                ok = spec.memory_gb + 1e-9 >= request.memory_gb
                hit = (None, None if ok else f"needs {request.memory_gb:g} GB per GPU")
            else:
                p = mig.smallest_fitting_profile(gpu.geometry, memory_gb=request.memory_gb,
                                                 compute_slices=request.compute_slices)
                hit = (p.name, None) if p else (None, f"no slice with {request.memory_gb:g} GB "
                                                      f"and {request.compute_slices} compute slices")
            self._slice_cache[key] = hit
        return hit

    def free_share(self, model: str | None = None) -> float:
        """Free share of schedulable capacity (of one model, or of the pool): 1 = all free."""
        if model is None:
            cap = sum(self._cap.values())
            return sum(self._free_sum.values()) / cap if cap else 0.0
        cap = self._cap.get(model, 0)
        return self._free_sum[model] / cap if cap else 0.0

    def has_legal_start(self, gpu: GpuState, profile: str) -> bool:
        return profile in self._by_uuid[gpu.uuid].avail

    def is_free(self, gpu: GpuState) -> bool:
        return not gpu.instances

    def milli_free(self, gpu: GpuState) -> int:
        """Milli-GPU left for fractional shares: 0 on a MIG GPU or one held whole, else 1000 less the shares."""
        if gpu.geometry is not None:
            return 0
        used = 0
        for i in gpu.instances:
            if not i.milli:
                return 0
            used += i.milli
        return MILLI - used

    def host_fits(self, node: NodeState, request: Request) -> str | None:
        """None when the node has the CPU and memory `request` asks left (or does not model them), else why not."""
        if node.cpu_milli is not None and node.cpu_milli - node.cpu_used < request.cpu_milli:
            return "not enough CPU on node"
        if node.memory_mib is not None and node.memory_mib - node.memory_used < request.memory_mib:
            return "not enough memory on node"
        return None

    def use_workload(self, mix: WorkloadMix | None, *, memory: bool = True) -> None:
        """Score fractional placements by FGD's fragmentation with this workload (None: best fit)."""
        self.milli_frag = None if mix is None else FragTable(mix, memory=memory)

    def layout(self, gpu: GpuState) -> tuple[tuple[str, int], ...]:
        return self._by_uuid[gpu.uuid].layout

    def free_gpu_count(self, node: NodeState, request: Request) -> int:
        """Free GPUs on `node` that could each serve one GPU of `request` (model, health, memory)."""
        n = 0
        for rec in self.by_node[node.id]:
            g = rec.gpu
            if g.instances or g.health == "cordoned" or (g.health == "degraded" and request.mode != "spot"):
                continue
            if request.models is not None and g.model not in request.models:
                continue
            if self.slice_for(g, request)[1] is None:
                n += 1
        return n

    def gangs(self, model: str) -> tuple[tuple[int, float], ...]:
        """The model's demand for k GPUs on one node (`DemandMix.multi_gpu`) that a node of this pool can host:
        k at most the most GPUs of the model on one node. The mix counts a k-GPU request on every MIG model it
        could run on, so without this the A30s of nodes of two and four carry the demand of 8-GPU jobs."""
        if self._gangs_version != self.mix.version:
            self._gangs = {}
            self._gangs_version = self.mix.version
        hit = self._gangs.get(model)
        if hit is None:
            most = self.most_on_a_node.get(model, 0)
            hit = self._gangs[model] = tuple((k, p) for k, p in self.mix.multi_gpu(model) if k <= most)
        return hit

    def pin_scarcity(self, model: str) -> float:
        """How scarce `model` is for the demand pinned to it, 0 to 1 (see PIN_SCARCE_FROM): 0 while at most
        PIN_SCARCE_FROM of its schedulable capacity is taken, 1 when all of it is; 1 always when PIN_SCARCE_FROM ≥ 1.
        From the first time a model is asked, its level follows its GPUs (`_follow_scarcity`)."""
        if PIN_SCARCE_FROM >= 1:
            return 1.0
        level = self._pin_level.get(model)
        if level is None:
            level = self._pin_level[model] = self._scarcity_now(model)
        return level

    def _scarcity_now(self, model: str) -> float:
        taken = 1.0 - self.free_share(model)
        return min(1.0, max(0.0, (taken - PIN_SCARCE_FROM) / (1.0 - PIN_SCARCE_FROM)))

    def _follow_scarcity(self, model: str) -> None:
        level = self._pin_level[model]
        now = self._scarcity_now(model)
        if abs(now - level) >= PIN_SCARCE_STEP - 1e-12 or (now != level and now in (0.0, 1.0)):
            self._pin_level[model] = now
            self.mix.version += 1  # the costs that carry the pin charge are memoised by version

    def option_memo(self) -> dict:
        """placement.single_option's memo of what an option on a GPU's own layout costs, valid for one
        demand-mix version (and one `node_term` setting)."""
        stamp = (self.mix.version, self.node_term)
        if self._opt_stamp != stamp or len(self._opt_memo) > 200_000:
            self._opt_memo = {}
            self._opt_stamp = stamp
        return self._opt_memo

    def pu(self, model: str, profile: str | None) -> float:
        key = (model, profile)
        if key not in self._pu_cache:
            spec = GPU_MODELS[model]
            self._pu_cache[key] = (perf.gpu_pu(spec) if profile is None or spec.mig is None
                                   else perf.profile_pu(spec, spec.mig.profile(profile)))
        return self._pu_cache[key]

    def price_per_hour(self, *, base_per_gpu_hour: float, share: float, mode: str, model: str) -> float:
        """pricing.slice_price with this pool's rules and the model's spot factor (floats, for the engine)."""
        factor = self._static_factors.get(mode)
        if factor is None:
            recorded = self.spot_factors.get(model)
            factor = float(recorded if recorded is not None else
                           self.rules.spot_factor(free_share=self.free_share(model)))
        return base_per_gpu_hour * share * factor

    # --- changes ---------------------------------------------------------------------------------------

    @contextmanager
    def overlay(self, changes: dict[str, list[PlacedInstance]]) -> Iterator["Pool"]:
        """The pool with some GPUs' instances replaced (GPU uuid -> instances) until the block ends, when every
        index is put back as it was. The market decides a reservation against the pool of now with the
        windows it must respect and the leases gone by then, without building a second pool."""
        saved: dict[str, list[PlacedInstance]] = {}
        try:
            for uuid, instances in changes.items():
                rec = self._by_uuid.get(uuid)
                if rec is None:
                    continue
                saved[uuid] = list(rec.gpu.instances)
                rec.gpu.instances[:] = list(instances)
                self._refresh(rec)
            yield self
        finally:
            for uuid, instances in saved.items():
                rec = self._by_uuid[uuid]
                rec.gpu.instances[:] = instances
                self._refresh(rec)

    def allocate(self, decision: Decision, request: Request) -> None:
        """Apply a decision: remove the preempted spot leases, then create its instances.
        Raises CapacityError (changing nothing) if a placement is no longer legal."""
        if not decision.ok:
            raise CapacityError("cannot allocate an unschedulable decision")
        for lease in decision.preempt:
            for rec in [self.records[i] for i in self.leases.get(lease, ())]:
                if any(i.lease_id == lease and i.priority != "spot" for i in rec.gpu.instances):
                    raise CapacityError(f"lease {lease} is not spot; only spot is preempted")
        removed = [(u, lease) for lease in decision.preempt for u in self.lease_gpus(lease)]
        saved = {u: list(self._by_uuid[u].gpu.instances) for u, _ in removed}
        for u, lease in removed:
            self.release(u, lease)
        try:
            self._check(decision, request)
        except CapacityError:
            for u, insts in saved.items():  # undo the preemption: the decision is refused whole
                self._by_uuid[u].gpu.instances[:] = insts
                self._refresh(self._by_uuid[u])
            raise
        for n, p in enumerate(decision.placements):
            rec = self._by_uuid[p.gpu_uuid]
            host = (request.cpu_milli, request.memory_mib) if n == 0 else (0, 0)  # the node's share, once
            rec.gpu.instances.append(PlacedInstance(p.profile, p.start, request.lease_id, request.mode,
                                                    request.remaining_value, p.milli, *host))
            self._refresh(rec)

    def _check(self, decision: Decision, request: Request | None = None) -> None:
        seen: set[str] = set()
        first = self._by_uuid.get(decision.placements[0].gpu_uuid) if decision.placements else None
        why = self.host_fits(first.node, request) if request is not None and first is not None else None
        if why:
            raise CapacityError(why)
        for p in decision.placements:
            rec = self._by_uuid.get(p.gpu_uuid)
            if rec is None:
                raise CapacityError(f"unknown GPU {p.gpu_uuid!r}")
            if p.gpu_uuid in seen and p.profile is None:
                raise CapacityError(f"GPU {p.gpu_uuid} placed twice")
            seen.add(p.gpu_uuid)
            g = rec.gpu
            if g.health == "cordoned" or not rec.node.online:
                raise CapacityError(f"GPU {g.uuid} is not schedulable")
            if p.milli:
                if not 0 < p.milli < MILLI or self.milli_free(g) < p.milli:
                    raise CapacityError(f"GPU {g.uuid} has not {p.milli} milli left")
                continue
            if p.profile is None:
                if g.instances:
                    raise CapacityError(f"GPU {g.uuid} is not free")
                continue
            if g.geometry is None or any(i.profile is None for i in g.instances):
                raise CapacityError(f"GPU {g.uuid} is not split into MIG instances")
            reason = mig.why_not(g.geometry, [mig.Instance(*x) for x in rec.layout], p.profile, p.start)
            if reason:
                raise CapacityError(f"GPU {g.uuid}: {reason}")

    def release(self, gpu_uuid: str, lease_id: str) -> int:
        """Remove the instances of `lease_id` on one GPU; returns how many went."""
        rec = self._by_uuid[gpu_uuid]
        before = len(rec.gpu.instances)
        rec.gpu.instances[:] = [i for i in rec.gpu.instances if i.lease_id != lease_id]
        self._refresh(rec)
        return before - len(rec.gpu.instances)

    def release_lease(self, lease_id: str) -> int:
        """Remove every instance of `lease_id` (all its GPUs); returns how many went."""
        return sum(self.release(u, lease_id) for u in self.lease_gpus(lease_id))

    def lease_gpus(self, lease_id: str) -> list[str]:
        return [self.records[i].gpu.uuid for i in sorted(self.leases.get(lease_id, ()))]

    def set_gpu_health(self, gpu_uuid: str, health: str) -> None:
        rec = self._by_uuid[gpu_uuid]
        rec.gpu.health = health  # type: ignore[assignment]
        self._refresh(rec)

    def set_node(self, node_id: str, **changes: object) -> None:
        """Change node fields (online, price_per_gpu_hour, reliability, interruption_rate, cuda_version)."""
        node = self.nodes[node_id]
        for k, v in changes.items():
            if k == "gpus" or not hasattr(node, k):
                raise ValueError(f"cannot set node field {k!r}")
            setattr(node, k, v)
        for rec in self.by_node[node_id]:
            self._refresh(rec, rekey=True)

    # --- index maintenance -------------------------------------------------------------------------------

    def _static_key(self, rec: GpuRecord) -> float:
        """Node quality under the default weights, best first: price per PU of a whole GPU on demand, and
        reliability. The fast path walks each index list in this order (a heuristic, not an exact bound)."""
        n = rec.node
        ppu = n.price_per_gpu_hour * self._static_factors["on_demand"] / self.pu(rec.gpu.model, None)
        return (DEFAULT_WEIGHTS["price"] * PriceScorer().normalise(ppu)
                + DEFAULT_WEIGHTS["reliability"] * ReliabilityScorer().normalise(
                    n.reliability if rec.gpu.reliability is None else rec.gpu.reliability))

    def _spot_key(self, rec: GpuRecord) -> float:
        """The static key plus the interruption term under the default weights: spot requests are scored on
        how often the node interrupted spot leases, so their walks take the nodes in this order."""
        return rec.key + DEFAULT_WEIGHTS["interruption"] * InterruptionScorer().normalise(rec.node.interruption_rate)

    def _refresh(self, rec: GpuRecord, *, rekey: bool = False) -> None:
        """Recompute one GPU's entries in every index (remove the old ones, add the new)."""
        g, model = rec.gpu, rec.gpu.model
        if rec.schedulable:
            self._free_sum[model] -= rec.free_frac
            self._cap[model] -= 1
            if rec.free_whole:
                self._set_node_free(rec.node.id, -1)
        for name in rec.avail:
            self._index_remove(model, name, rec.region, rec)
            if name not in (WHOLE, FIXED):
                self._layout_remove(model, name, rec)
        whole_used = any(i.profile is None for i in g.instances)
        rec.layout = () if whole_used else tuple(sorted((i.profile, i.start) for i in g.instances))  # type: ignore[misc]
        rec.schedulable = rec.node.online and g.health != "cordoned"
        rec.free_whole = rec.schedulable and not g.instances
        if whole_used:
            avail: frozenset[str] = frozenset()
            rec.free_frac = self.milli_free(g) / MILLI  # shares leave the rest of the GPU free; whole: 0
        elif g.geometry is None:
            avail = frozenset() if g.instances else frozenset((FIXED,))
            rec.free_frac = 0.0 if g.instances else 1.0
        else:
            avail = self._mig_avail(model, g.geometry, rec.layout)
            free_mem, free_cs = mig.free_capacity(g.geometry, [mig.Instance(*x) for x in rec.layout])
            rec.free_frac = min(free_mem / g.geometry.memory_slices, free_cs / g.geometry.compute_slices)
        if rec.schedulable:
            self._free_sum[model] += rec.free_frac
            self._cap[model] += 1
            if rec.free_whole:
                self._set_node_free(rec.node.id, +1)
        else:
            avail = frozenset()
        if model in self._pin_level:
            self._follow_scarcity(model)
        if rekey or not rec.keyed:
            rec.key, rec.keyed = self._static_key(rec), True
            rec.skey = self._spot_key(rec)
            self.max_key = max(self.max_key, rec.key)
            self.max_skey = max(self.max_skey, rec.skey)
            self.model_max_key[model] = max(self.model_max_key.get(model, rec.key), rec.key)
            self.model_max_skey[model] = max(self.model_max_skey.get(model, rec.skey), rec.skey)
        rec.region = rec.node.region
        for name in avail:
            by_region = self.avail[(model, name)]
            if rec.region not in by_region:
                self.avail_epoch += 1  # a new index list: the scheduler's memo of lists is stale
            bisect.insort(by_region[rec.region], (-rec.key, rec.idx))
            bisect.insort(self.avail_spot[(model, name)][rec.region], (-rec.skey, rec.idx))
            if name not in (WHOLE, FIXED):
                buckets = self.by_layout[(model, name)]
                if rec.layout not in buckets:
                    buckets[rec.layout] = {}
                    self.layout_epoch[(model, name)] += 1
                for index, heads, key in ((self.by_layout, self.layout_head, -rec.key),
                                          (self.by_layout_spot, self.layout_head_spot, -rec.skey)):
                    bisect.insort(index[(model, name)].setdefault(rec.layout, {}).setdefault(rec.region, []),
                                  (key, rec.idx))
                    kind_heads = heads[(model, name)]
                    if key < kind_heads.get(rec.layout, float("inf")):
                        kind_heads[rec.layout] = key
        rec.avail = avail
        groups = self.node_groups[rec.node.id]
        if rec.sig is not None:
            members = groups[rec.sig]
            del members[rec.idx]
            if not members:
                del groups[rec.sig]
        rec.sig = (model, g.geometry is None, g.health, avail)
        groups.setdefault(rec.sig, {})[rec.idx] = None
        leases = frozenset(i.lease_id for i in g.instances if i.lease_id)
        for lease in rec.leases - leases:
            self.leases[lease].discard(rec.idx)
            if not self.leases[lease]:
                del self.leases[lease]
        for lease in leases - rec.leases:
            self.leases[lease].add(rec.idx)
        rec.leases = leases
        node_id = rec.node.id
        bucket = (node_class(rec.node), rec.sig)
        if rec.bucket != bucket:
            kind_buckets = self.reason_buckets[(model, g.geometry is None)]
            if rec.bucket is not None:
                members = kind_buckets[rec.bucket]
                del members[rec.idx]
                if not members:
                    del kind_buckets[rec.bucket]
            kind_buckets.setdefault(bucket, {})[rec.idx] = None
            rec.bucket = bucket
        self._refresh_free_node(node_id)
        spot_values = [i.remaining_value for i in g.instances if _preemptible(i)]
        # no removal of spot leases here costs less than this (values are normally >= 0; with negative ones
        # the bound is their sum)
        lb = min(min(spot_values), sum(v for v in spot_values if v < 0)) if spot_values else None
        kind = (model, g.geometry is None)
        if rec.spot_lb is not None:
            lst = self.spot_lb[kind]
            i = bisect.bisect_left(lst, (rec.spot_lb, rec.idx))
            if i < len(lst) and lst[i] == (rec.spot_lb, rec.idx):
                del lst[i]
        if lb is not None:
            bisect.insort(self.spot_lb[kind], (lb, rec.idx))
        rec.spot_lb = lb
        pfree = all(_preemptible(i) for i in g.instances)
        has_spot = lb is not None
        if pfree != rec.pfree:
            old = self.node_pfree[node_id]
            new = old + (1 if pfree else -1)
            self.nodes_by_pfree[old].discard(node_id)
            self.nodes_by_pfree[new].add(node_id)
            tag = self._node_tag(rec.node)
            self.nodes_by_kind_pfree[(tag, old)].discard(node_id)
            self.nodes_by_kind_pfree[(tag, new)].add(node_id)
            self.node_pfree[node_id] = new
            rec.pfree = pfree
        if has_spot != rec.has_spot:
            self.node_spot[node_id] += 1 if has_spot else -1
            rec.has_spot = has_spot
        if has_spot:
            self.spot_gpus.add(rec.idx)
        else:
            self.spot_gpus.discard(rec.idx)
        self._refresh_milli(rec)

    def _refresh_milli(self, rec: GpuRecord) -> None:
        """The GPU's fractional bucket, and its node's CPU and memory in use."""
        free = self.milli_free(rec.gpu) if rec.schedulable else 0
        old = self._milli_bucket.pop(rec.idx, None)
        if old is not None:
            del self.milli_index[old][rec.idx]
        if free > 0:
            b = free // 100
            self.milli_index[b][rec.idx] = None
            self._milli_bucket[rec.idx] = b
        node = rec.node
        if node.cpu_milli is not None or node.memory_mib is not None:
            insts = [i for r in self.by_node[node.id] for i in r.gpu.instances]
            held = self.host_held.get(node.id, (0, 0))
            node.cpu_used = held[0] + sum(i.cpu_milli for i in insts)
            node.memory_used = held[1] + sum(i.memory_mib for i in insts)
        self._refresh_mstate(node)

    def _refresh_mstate(self, node: NodeState) -> None:
        """File the node under its fractional state: its non-MIG GPUs (model, milli free, health, reliability),
        what the filters read of it (`node_class`, price, CPU and memory), and what the scorers read."""
        recs = self.by_node.get(node.id)
        if not recs:
            return
        gpus = tuple(sorted((r.gpu.model, self.milli_free(r.gpu) if r.schedulable else 0, r.gpu.health,
                             r.gpu.reliability or -1.0) for r in recs if r.gpu.geometry is None))
        state = (gpus, node_class(node), node.price_per_gpu_hour, node.reliability, node.interruption_rate,
                 node.cpu_milli, node.cpu_used, node.memory_mib, node.memory_used)
        bucket = max((g[1] for g in gpus), default=0) // 100
        old = self._node_mstate.get(node.id)
        if old == (bucket, state):
            return
        if old is not None:
            members = self.milli_states[old[0]][old[1]]
            del members[node.id]
            if not members:
                del self.milli_states[old[0]][old[1]]
        if any(g[1] > 0 for g in gpus):
            self.milli_states[bucket].setdefault(state, {})[node.id] = recs[0].idx
            self._node_mstate[node.id] = (bucket, state)
        else:
            self._node_mstate.pop(node.id, None)

    def milli_node_states(self, milli: int, k: int) -> Iterator[tuple[tuple, dict[str, int]]]:
        """(state, its nodes -> first pool index) for node states with k GPUs of `milli` free or more."""
        for b in range(min(milli, MILLI) // 100, MILLI // 100 + 1):
            for state, members in self.milli_states.get(b, {}).items():
                if sum(1 for g in state[0] if g[1] >= milli) >= k:
                    yield state, members

    def hold_host(self, node_id: str, cpu_milli: int, memory_mib: int) -> None:
        """Hold CPU and memory on a node for work that uses no GPU (a simulator's CPU-only pods); raises
        CapacityError, changing nothing, where the node has not that much left."""
        node = self.nodes[node_id]
        why = self.host_fits(node, Request(cpu_milli=cpu_milli, memory_mib=memory_mib))
        if why:
            raise CapacityError(f"node {node_id}: {why}")
        cpu, mem = self.host_held.get(node_id, (0, 0))
        self.host_held[node_id] = (cpu + cpu_milli, mem + memory_mib)
        node.cpu_used += cpu_milli
        node.memory_used += memory_mib
        self._refresh_mstate(node)

    def milli_candidates(self, milli: int) -> Iterator[GpuRecord]:
        """Schedulable non-MIG GPUs with at least `milli` free, from the buckets that can hold it."""
        for b in range(min(milli, MILLI) // 100, MILLI // 100 + 1):
            for idx in self.milli_index.get(b, ()):
                rec = self.records[idx]
                if b > milli // 100 or self.milli_free(rec.gpu) >= milli:
                    yield rec

    def _refresh_free_node(self, node_id: str) -> None:
        """Move the node to the free-node bucket of its class and its free GPUs' sigs."""
        recs = self.by_node[node_id]
        free = tuple(sorted((r.sig for r in recs if not r.gpu.instances and r.sig is not None),
                            key=lambda sig: sig[:3]))
        key = (node_class(recs[0].node), free)
        old = self._node_fkey.get(node_id)
        if old == key:
            return
        if old is not None:
            by_free = self.free_nodes[old[0]]
            members = by_free[old[1]]
            del members[node_id]
            if not members:
                del by_free[old[1]]
                if not by_free:
                    del self.free_nodes[old[0]]
        if free:
            self.free_nodes.setdefault(key[0], {}).setdefault(free, {})[node_id] = None
            self._node_fkey[node_id] = key
        else:
            self._node_fkey.pop(node_id, None)

    def _node_tag(self, node: NodeState) -> str | None:
        """The model of every GPU on the node, or None for a node with several models (GPUs never change
        model)."""
        if node.id not in self._tags:
            models = {g.model for g in node.gpus}
            self._tags[node.id] = next(iter(models)) if len(models) == 1 else None
        return self._tags[node.id]

    def nodes_for_preemption(self, k: int, models: Iterable[str] | None = None) -> list[str]:
        """Nodes holding spot leases with at least k GPUs that are free or hold only spot, in pool order;
        with `models`, only nodes that have a GPU of one of those models (`nodes_by_kind_pfree`)."""
        if models is None:
            found = [n for c, ids in self.nodes_by_pfree.items() if c >= k for n in ids if self.node_spot[n] > 0]
        else:
            wanted = set(models)
            found = [n for (tag, c), ids in self.nodes_by_kind_pfree.items()
                     if c >= k and (tag is None or tag in wanted) for n in ids if self.node_spot[n] > 0]
            found = [n for n in found if self._tags[n] is not None  # several models: does it have one?
                     or any(r.gpu.model in wanted for r in self.by_node[n])]
        return sorted(found, key=lambda n: self.by_node[n][0].idx)

    def _set_node_free(self, node_id: str, change: int) -> None:
        old = self.node_free[node_id]
        self.nodes_by_free[old].discard(node_id)
        self.node_free[node_id] = old + change
        self.nodes_by_free[old + change].add(node_id)

    def _layout_remove(self, model: str, name: str, rec: GpuRecord) -> None:
        for index, heads, entry in ((self.by_layout, self.layout_head, (-rec.key, rec.idx)),
                                    (self.by_layout_spot, self.layout_head_spot, (-rec.skey, rec.idx))):
            buckets = index[(model, name)]
            by_region = buckets[rec.layout]
            lst = by_region[rec.region]
            i = bisect.bisect_left(lst, entry)
            if i < len(lst) and lst[i] == entry:
                del lst[i]
            if not lst:
                del by_region[rec.region]
                if not by_region:
                    del buckets[rec.layout]
                    del heads[(model, name)][rec.layout]
                    if index is self.by_layout:
                        self.layout_epoch[(model, name)] += 1
                    continue
            if i == 0:  # it may have been the bucket's best entry
                heads[(model, name)][rec.layout] = min(lst[0][0] for lst in by_region.values())

    def _index_remove(self, model: str, name: str, region: str, rec: GpuRecord) -> None:
        for index, entry in ((self.avail, (-rec.key, rec.idx)), (self.avail_spot, (-rec.skey, rec.idx))):
            lst = index[(model, name)][region]
            i = bisect.bisect_left(lst, entry)
            if i < len(lst) and lst[i] == entry:
                del lst[i]

    def _mig_avail(self, model: str, geometry: mig.MigGeometry, layout: tuple) -> frozenset[str]:
        key = (model, layout)
        hit = self._avail_cache.get(key)
        if hit is None:
            insts = [mig.Instance(*x) for x in layout]
            names = {p.name for p in geometry.profiles if mig.legal_starts(geometry, insts, p.name)}
            if not layout:
                names.add(WHOLE)
            hit = self._avail_cache[key] = frozenset(names)
        return hit
