"""Snapshot → engine → lock → re-check → retry: the one claim pipeline (DESIGN §6, last paragraph).

1. `pool_snapshot` loads online nodes, their GPUs and active slices in three queries and builds the pure
   engine's `Pool`. The caller says what each slice is (`classify`: lease id, class, remaining value — the
   fleet does not know leases), which capacity is held without a slice (`holds`: reserved windows), and the
   price rules and recorded spot factors the engine prices with.
2. `scheduler.core.engine.Scheduler.decide` picks a placement (or says why none fits, or which spot leases
   would have to go).
3. A `Claim` takes what the decision names: it locks the rows the decision depends on in primary-key order
   (no deadlock between two claims), re-checks under those locks what the snapshot said, and writes; a lost
   race raises `LostRace`, which rolls its savepoint back. `allocate` then decides again on a fresh snapshot,
   a bounded number of times. Every way capacity is taken goes through `allocate`: slices carved now
   (`SliceClaim`, here), reserved windows booked and moved, and resold windows (marketplace/claims).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generic, Iterable, Protocol, TypeVar

from django.db import transaction

from nodeagent.hardware import mig as core_mig
from scheduler.core.engine import Pool, Scheduler
from scheduler.core.fragmentation import DemandMix
from scheduler.core.model import Decision, GpuState, NodeState, PlacedInstance, Request
from scheduler.core.pricing import DEFAULT_RULES, PriceRules
from scheduler.core.slots import Slots
from scheduler.errors import Conflict
from scheduler.models import Gpu, Node, Slice

from .slices import slice_create

T = TypeVar("T")


class LostRace(Conflict):
    """Someone took what the snapshot showed free before our locks were held."""

    def __init__(self, message: str = "lost the race for capacity", **kw):
        super().__init__(message, code="lost_race", **kw)


@dataclass(frozen=True)
class Occupant:
    """What holds a slice, as far as the engine cares (None lease id = never preempted)."""

    lease_id: str | None = None
    priority: str = "on_demand"
    remaining_value: float = 0.0


@dataclass(frozen=True)
class Hold:
    """Capacity held without a slice (a reserved window): `profile` at `start` on GPU `gpu_id`;
    profile None = the whole GPU."""

    gpu_id: int
    profile: str | None
    start: int

    def slots(self, geometry: core_mig.MigGeometry | None) -> Slots:
        return Slots.of(geometry, self.profile, self.start)


@dataclass(frozen=True, slots=True)
class GpuRow:
    """What a snapshot keeps of a GPU row (a plain record: 10,000 model instances would cost the collector)."""

    pk: int
    uuid: str
    node_id: str
    name: str
    model: str  # catalog key
    geometry: core_mig.MigGeometry | None


@dataclass(frozen=True, slots=True)
class SliceRow:
    """What a snapshot keeps of an active slice."""

    pk: object
    gpu_id: int
    profile: str
    start: int
    state: str


Classify = Callable[[SliceRow], "Occupant | None"]  # None: the slice does not count for this decision
HoldsFor = Callable[[int], "list[Hold]"]  # the holds on one GPU, read again under its row lock


@dataclass
class Snapshot:
    pool: Pool
    gpu_ids: dict[str, int] = field(default_factory=dict)  # GPU uuid -> pk
    nodes: dict[str, Node] = field(default_factory=dict)
    gpus: dict[str, GpuRow] = field(default_factory=dict)
    slices: dict[str, list[SliceRow]] = field(default_factory=dict)  # GPU uuid -> its active slices

    def facts(self, gpu_uuid: str) -> tuple[GpuRow, Node, core_mig.MigGeometry | None]:
        """The GPU, its node and its geometry, as loaded for this snapshot."""
        gpu = self.gpus[gpu_uuid]
        return gpu, self.nodes[gpu.node_id], gpu.geometry


def _instance_slots(geometry, i: PlacedInstance) -> Slots:
    return Slots.of(geometry, i.profile, i.start)


def with_holds(geometry: core_mig.MigGeometry | None, instances: list[PlacedInstance],
               holds: Iterable[Hold]) -> list[PlacedInstance]:
    """`instances` with the held windows added as reserved instances. Where a hold overlaps an instance
    already there (a spot lease on slots a reservation starts on, or the reservation's own running slice),
    that instance becomes unpreemptible instead: the engine must neither place on those slots nor free them
    for someone else."""
    out = list(instances)
    for h in holds:
        held = h.slots(geometry)
        clash = [n for n, i in enumerate(out) if _instance_slots(geometry, i).overlaps(held)]
        if clash:
            for n in clash:
                i = out[n]
                out[n] = PlacedInstance(i.profile, i.start, None, "reserved", i.remaining_value)
        else:
            profile = h.profile if geometry is not None else None
            out.append(PlacedInstance(profile, h.start if profile else 0, None, "reserved"))
    return out


def placed(geometry: core_mig.MigGeometry | None, slices: Iterable[SliceRow],
           classify: Classify | None) -> list[PlacedInstance]:
    """The engine's instances for a GPU's active slices, as `classify` says what each is (None: not counted)."""
    out = []
    for sl in slices:
        occ = classify(sl) if classify else Occupant()
        if occ is None:
            continue
        profile = sl.profile if (sl.profile and geometry is not None) else None
        out.append(PlacedInstance(profile, sl.start if profile else 0, occ.lease_id, occ.priority,
                                  occ.remaining_value))
    return out


def pool_snapshot(*, models: Iterable[str] | None = None, classify: Classify | None = None,
                  holds: Iterable[Hold] = (), interruption_rate: dict | None = None,
                  rules: PriceRules = DEFAULT_RULES, spot_factors: dict | None = None,
                  mix: DemandMix | None = None) -> Snapshot:
    """The schedulable pool now: online nodes, their present GPUs (of `models`) and active slices; 3 queries,
    read as plain rows. `mix`: the demand mix the engine weighs packing by (the prior alone by default)."""
    nodes = {str(n.pk): n for n in Node.objects.filter(status=Node.Status.ONLINE)}
    gpu_qs = (Gpu.objects.filter(node__status=Node.Status.ONLINE, present=True, gpu_model__isnull=False)
              .order_by("node_id", "index"))
    slice_qs = Slice.objects.filter(state__in=Slice.ACTIVE_STATES, gpu__node__status=Node.Status.ONLINE,
                                    gpu__present=True)
    if models:
        gpu_qs = gpu_qs.filter(gpu_model__key__in=list(models))
        slice_qs = slice_qs.filter(gpu__gpu_model__key__in=list(models))
    by_gpu: dict[int, list[SliceRow]] = {}
    for row in slice_qs.order_by("gpu_id", "start").values_list("pk", "gpu_id", "profile", "start", "state"):
        by_gpu.setdefault(row[1], []).append(SliceRow(*row))
    holds_by_gpu: dict[int, list[Hold]] = {}
    for h in holds:
        holds_by_gpu.setdefault(h.gpu_id, []).append(h)
    rates = interruption_rate or {}
    states: dict[str, NodeState] = {}
    snap = Snapshot(pool=None, nodes=nodes)  # type: ignore[arg-type]
    geometry_of = Gpu()  # Gpu.geometry() parses (and shares) what the agent reported
    for pk, uuid, node_id, name, model, mig_enabled, mig_geometry, health, reliability in gpu_qs.values_list(
            "pk", "uuid", "node_id", "name", "gpu_model__key", "mig_enabled", "mig_geometry", "health", "reliability"):
        node = nodes.get(str(node_id))
        if node is None:
            continue
        ns = states.get(str(node.pk))
        if ns is None:
            ns = states[str(node.pk)] = NodeState(
                id=str(node.pk), region=node.region, online=True, cuda_version=node.cuda_version or "0",
                price_per_gpu_hour=float(node.price_per_gpu_hour), reliability=node.reliability,
                interruption_rate=float(rates.get(str(node.pk), 0.0)),
                runs_containers=node.runs_containers, image_allowlist=tuple(node.image_allowlist or ()))
        geometry_of.mig_enabled, geometry_of.mig_geometry = mig_enabled, mig_geometry
        geometry = geometry_of.geometry()
        instances = with_holds(geometry, placed(geometry, by_gpu.get(pk, ()), classify), holds_by_gpu.get(pk, ()))
        ns.gpus.append(GpuState(uuid=uuid, node_id=ns.id, model=model, geometry=geometry, instances=instances,
                                health=health, reliability=reliability))
        snap.gpu_ids[uuid] = pk
        snap.gpus[uuid] = GpuRow(pk, uuid, ns.id, name, model, geometry)
        snap.slices[uuid] = by_gpu.get(pk, [])
    # The node states were built for this pool alone: no copy needed.
    snap.pool = Pool(states.values(), mix=mix, rules=rules, spot_factors=spot_factors, copy=False)
    return snap


def decide(*, snapshot: Snapshot, request: Request, allow_preemption: bool = True) -> Decision:
    """The engine's decision on `snapshot` (pure; changes nothing)."""
    return Scheduler(snapshot.pool).decide(request, allow_preemption=allow_preemption)


class Claim(Protocol[T]):
    """One way of taking capacity: decide on a snapshot, then take under locks (see the module doc)."""

    def decide(self) -> Decision: ...

    def take(self, decision: Decision) -> T: ...


def allocate(*, claim: Claim[T], retries: int = 8) -> tuple[Decision, T | None]:
    """Decide and take, deciding again after a lost race (at most `retries` times).

    Returns the decision and what was taken; None when it did not fit, when it fits only by preempting spot
    leases (decision.preempt: the caller interrupts them and tries again later), or when every try lost."""
    decision = Decision(ok=False)
    for _ in range(retries + 1):
        decision = claim.decide()
        if not decision.ok or decision.preempt:
            return decision, None
        try:
            with transaction.atomic():  # a savepoint: a lost try lets its locks and writes go
                return decision, claim.take(decision)
        except LostRace:
            continue
    return Decision(ok=False, reasons={f"lost the race for capacity {retries + 1} times": 1}), None


class SliceClaim(Generic[T]):
    """Carve the decision's slices now (k GPUs: k slices, all or none), re-checking the GPUs' layouts and the
    holds (`holds_for`, read again under each GPU's lock) against the snapshot's view."""

    def __init__(self, *, request: Request, snapshot: Callable[[], Snapshot], holds_for: HoldsFor | None = None,
                 allow_preemption: bool = True) -> None:
        self.request, self.snapshot, self.holds_for = request, snapshot, holds_for
        self.allow_preemption = allow_preemption
        self.snap: Snapshot | None = None

    def decide(self) -> Decision:
        self.snap = self.snapshot()
        return decide(snapshot=self.snap, request=self.request, allow_preemption=self.allow_preemption)

    def take(self, decision: Decision) -> list[Slice]:
        snap = self.snap
        out = []
        for p in sorted(decision.placements, key=lambda p: snap.gpu_ids[p.gpu_uuid]):
            gpu_id = snap.gpu_ids[p.gpu_uuid]
            # Lock the GPU row: the race is a reservation booked, or a slice carved, on these slots between
            # our snapshot and this claim; the holds and the layout are read again under the lock.
            gpu = Gpu.objects.select_for_update().get(pk=gpu_id)
            start = start_under_lock(gpu, p.profile, p.start, self.holds_for(gpu_id) if self.holds_for else [])
            try:
                out.append(slice_create(gpu_id=gpu_id, profile=p.profile, start=start))
            except Conflict as exc:  # the node or GPU changed under us (offline, cordoned)
                raise LostRace(exc.message) from exc
        return out


def legal_starts_among(geometry: core_mig.MigGeometry | None, profile: str | None,
                       occupied: Iterable[tuple[str | None, int]]) -> list[int]:
    """Where `profile` (None: the whole GPU) may start on a GPU holding `occupied` ((profile, start) pairs;
    profile None = the whole GPU). An occupant overlapping one already counted (a reserved window and the
    slice its own lease runs on) counts once."""
    counted: list[core_mig.Instance] = []
    for p, start in occupied:
        if p is None or geometry is None:
            return []
        slots = Slots.of(geometry, p, start)
        if not any(Slots.of(geometry, c.profile, c.start).overlaps(slots) for c in counted):
            counted.append(core_mig.Instance(p, start))
    if profile is None or geometry is None:
        return [] if counted else [0]
    return core_mig.legal_starts(geometry, counted, profile)


def start_under_lock(gpu: Gpu, profile: str | None, preferred: int, holds: list[Hold]) -> int | None:
    """The decided start if still legal with the slices and holds now on the GPU (locked by the caller),
    else another legal one; LostRace when none is."""
    geometry = gpu.geometry()
    occupied = [(s.profile or None, s.start) for s in gpu.slices.filter(state__in=Slice.ACTIVE_STATES)]
    occupied += [(h.profile if geometry is not None else None, h.start) for h in holds]
    starts = legal_starts_among(geometry, profile if geometry is not None else None, occupied)
    if not starts:
        raise LostRace(f"{gpu} has no room for {profile or 'the whole GPU'} any more")
    if profile is None or geometry is None:
        return None
    return preferred if preferred in starts else starts[0]
