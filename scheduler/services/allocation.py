"""Snapshot → engine → claim: the Django side of scheduling (DESIGN §6, last paragraph).

1. `pool_snapshot` loads online nodes, their GPUs and active slices in three queries and builds the pure
   engine's `Pool`. The caller says what each slice is (`classify`: lease id, class, remaining value — the
   fleet does not know leases) and which capacity is held without a slice (`holds`: reserved windows).
2. `scheduler.core.engine.Scheduler.decide` picks a placement (or says why none fits, or which spot leases
   would have to go).
3. `claim` carves the chosen slice with `slices.slice_create` under the GPU's row lock, re-checking the holds
   under that lock. A lost race (someone took the slots since the snapshot) tries another legal start on the
   same GPU, then `allocate` decides again on a fresh snapshot, a bounded number of times.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from django.db import transaction

from scheduler.core import mig as core_mig
from scheduler.core.engine import Pool, Scheduler
from scheduler.core.model import Decision, GpuState, NodeState, PlacedInstance, Request
from scheduler.errors import Conflict
from scheduler.models import Gpu, Node, Slice

from .slices import slice_create


@dataclass(frozen=True)
class Occupant:
    """What holds a slice, as far as the engine cares (None lease id = never preempted)."""

    lease_id: str | None = None
    priority: str = "on_demand"
    remaining_value: float = 0.0


@dataclass(frozen=True)
class Hold:
    """Capacity held without a slice (a reserved window): `profile` at `start` on GPU `gpu_id`;
    profile None = the whole (non-MIG) GPU."""

    gpu_id: int
    profile: str | None
    start: int


Classify = Callable[[Slice], "Occupant | None"]  # None: the slice does not count for this decision
HoldsFor = Callable[[int], "list[Hold]"]  # the holds on one GPU, read again under its row lock


@dataclass
class Snapshot:
    pool: Pool
    gpu_ids: dict[str, int] = field(default_factory=dict)  # GPU uuid -> pk
    nodes: dict[str, Node] = field(default_factory=dict)
    gpus: dict[str, Gpu] = field(default_factory=dict)


def _slots(geometry: core_mig.MigGeometry | None, profile: str | None, start: int) -> range:
    if geometry is None or profile is None:
        return range(0, 64)  # a whole GPU overlaps everything on it
    return range(start, start + geometry.profile(profile).memory_slices)


def _overlaps(geometry, a: tuple[str | None, int], b: tuple[str | None, int]) -> bool:
    ra, rb = _slots(geometry, *a), _slots(geometry, *b)
    return ra.start < rb.stop and rb.start < ra.stop


def _apply_holds(gpu: GpuState, holds: Iterable[Hold]) -> None:
    """Add held windows as reserved instances. Where a hold overlaps an instance already there (a spot
    lease on slots a reservation starts on, or the reservation's own running slice), that instance becomes
    unpreemptible instead: the engine must neither place on those slots nor free them for someone else."""
    for h in holds:
        clash = [i for i in gpu.instances if _overlaps(gpu.geometry, (i.profile, i.start), (h.profile, h.start))]
        if clash:
            for i in clash:
                i.priority, i.lease_id = "reserved", None
        else:
            gpu.instances.append(PlacedInstance(h.profile, h.start, None, "reserved"))


def pool_snapshot(*, models: Iterable[str] | None = None, classify: Classify | None = None,
                  holds: Iterable[Hold] = (), interruption_rate: dict | None = None) -> Snapshot:
    """The schedulable pool now: online nodes, their present GPUs (of `models`) and active slices; 3 queries."""
    nodes = {str(n.pk): n for n in Node.objects.filter(status=Node.Status.ONLINE)}
    gpu_qs = (Gpu.objects.filter(node__status=Node.Status.ONLINE, present=True, gpu_model__isnull=False)
              .select_related("gpu_model").order_by("node_id", "index"))
    slice_qs = Slice.objects.filter(state__in=Slice.ACTIVE_STATES, gpu__node__status=Node.Status.ONLINE,
                                    gpu__present=True)
    if models:
        gpu_qs = gpu_qs.filter(gpu_model__key__in=list(models))
        slice_qs = slice_qs.filter(gpu__gpu_model__key__in=list(models))
    by_gpu: dict[int, list[Slice]] = {}
    for sl in slice_qs.order_by("gpu_id", "start"):
        by_gpu.setdefault(sl.gpu_id, []).append(sl)
    holds_by_gpu: dict[int, list[Hold]] = {}
    for h in holds:
        holds_by_gpu.setdefault(h.gpu_id, []).append(h)
    rates = interruption_rate or {}
    states: dict[str, NodeState] = {}
    snap = Snapshot(pool=None, nodes=nodes)  # type: ignore[arg-type]
    for gpu in gpu_qs:
        node = nodes.get(str(gpu.node_id))
        if node is None:
            continue
        ns = states.get(str(node.pk))
        if ns is None:
            ns = states[str(node.pk)] = NodeState(
                id=str(node.pk), region=node.region, online=True, cuda_version=node.cuda_version or "0",
                price_per_gpu_hour=float(node.price_per_gpu_hour), reliability=node.reliability,
                interruption_rate=float(rates.get(str(node.pk), 0.0)))
        geometry = gpu.geometry()
        instances = []
        for sl in by_gpu.get(gpu.pk, ()):
            occ = classify(sl) if classify else Occupant()
            if occ is None:
                continue
            profile = sl.profile if (sl.profile and geometry is not None) else None
            instances.append(PlacedInstance(profile, sl.start if profile else 0, occ.lease_id, occ.priority,
                                            occ.remaining_value))
        gs = GpuState(uuid=gpu.uuid, node_id=str(node.pk), model=gpu.gpu_model.key, geometry=geometry,
                      instances=instances, health=gpu.health)
        _apply_holds(gs, holds_by_gpu.get(gpu.pk, ()))
        ns.gpus.append(gs)
        snap.gpu_ids[gpu.uuid] = gpu.pk
        snap.gpus[gpu.uuid] = gpu
    snap.pool = Pool(states.values())
    return snap


def decide(*, snapshot: Snapshot, request: Request, allow_preemption: bool = True) -> Decision:
    """The engine's decision on `snapshot` (pure; changes nothing)."""
    return Scheduler(snapshot.pool).decide(request, allow_preemption=allow_preemption)


def claim(*, snapshot: Snapshot, decision: Decision, holds_for: HoldsFor | None = None) -> list[Slice]:
    """Carve the decision's slices (k GPUs: k slices, all or none). Raises Conflict when the race for any GPU
    was lost (nothing written). The GPU rows are locked in pk order, so two k-GPU claims cannot deadlock."""
    out = []
    with transaction.atomic():
        for p in sorted(decision.placements, key=lambda p: snapshot.gpu_ids[p.gpu_uuid]):
            gpu_id = snapshot.gpu_ids[p.gpu_uuid]
            # Lock the GPU row: the race is a reservation booked, or a slice carved, on these slots between
            # our snapshot and this claim; the holds and the layout are read again under the lock.
            gpu = Gpu.objects.select_for_update().get(pk=gpu_id)
            start = _start_under_lock(gpu, p.profile, p.start, holds_for(gpu_id) if holds_for else [])
            out.append(slice_create(gpu_id=gpu_id, profile=p.profile, start=start))
    return out


def _start_under_lock(gpu: Gpu, profile: str | None, preferred: int, holds: list[Hold]) -> int | None:
    """The decided start if still legal with the slices and holds now on the GPU, else another legal one."""
    geometry = gpu.geometry()
    active = list(gpu.slices.filter(state__in=Slice.ACTIVE_STATES))
    if profile is None or geometry is None:
        if holds or active:
            raise Conflict(f"{gpu} is taken", code="lost_race")
        return None
    taken = [core_mig.Instance(s.profile, s.start) for s in active if s.profile]
    mine = (profile, preferred)
    for h in holds:
        if h.profile is None:
            raise Conflict(f"{gpu} is reserved whole", code="lost_race")
        if not any(_overlaps(geometry, (s.profile, s.start), (h.profile, h.start)) for s in taken):
            taken.append(core_mig.Instance(h.profile, h.start))
    if core_mig.why_not(geometry, taken, *mine) is None:
        return preferred
    starts = core_mig.legal_starts(geometry, taken, profile)
    if not starts:
        raise Conflict(f"no legal placement for {profile} on {gpu} any more", code="lost_race")
    return starts[0]


def allocate(*, request: Request, snapshot: Callable[[], Snapshot], holds_for: HoldsFor | None = None,
             retries: int = 8, allow_preemption: bool = True) -> tuple[Decision, list[Slice]]:
    """Decide and claim, deciding again on a fresh snapshot after a lost race (at most `retries` times).

    Returns the decision and the claimed slices; no slices when it did not fit, or when it fits only by
    preempting spot leases (decision.preempt: the caller interrupts them and tries again later)."""
    decision = Decision(ok=False)
    for _ in range(retries + 1):
        snap = snapshot()
        decision = decide(snapshot=snap, request=request, allow_preemption=allow_preemption)
        if not decision.ok or decision.preempt:
            return decision, []
        try:
            return decision, claim(snapshot=snap, decision=decision, holds_for=holds_for)
        except Conflict:
            continue
    return Decision(ok=False, reasons={f"lost the race for capacity {retries + 1} times": 1}), []
