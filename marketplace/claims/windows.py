"""The market's claims, all run by the one pipeline (scheduler.services.allocation.allocate):

- `SlicesClaim`: slices carved now for an on-demand or spot order (k GPUs: k slices);
- `WindowClaim`: a reserved window booked on the slots the engine picks;
- `RelocationClaim`: a reserved window whose lease was lost moves to another legal slice of its unit, and
  that slice is carved;
- `ListingClaim`: a resold window changes hands (the reservation it is part of may have been split by
  another sale since we looked: then we look again).

Each decides on a view of a snapshot (snapshot.py) and takes under row locks in one order — reservation,
listing, GPU — re-checking what it decided on; the write itself (a Reservation row, a split, money) is the
product's, passed in as `write`.
"""
from __future__ import annotations

from datetime import datetime
from typing import Callable, Generic, TypeVar

from django.db import IntegrityError, transaction

from marketplace.models import Reservation, ResaleListing
from scheduler.core.model import Decision, PlacedInstance, Placement, Request
from scheduler.core.slots import Slots
from scheduler.errors import Conflict, NotFound
from scheduler.models import Gpu, Node, Slice
from scheduler.services.allocation import HoldsFor, LostRace, SliceClaim, Snapshot, decide, start_under_lock
from scheduler.services.slices import slice_create

from .snapshot import MarketSnapshot, fresh, view

T = TypeVar("T")


class _Viewed:
    """Decides on a view of `base` first (a batch's or a read path's snapshot), then on fresh ones."""

    def __init__(self, *, request: Request, start: datetime, end: datetime, window_start: datetime | None = None,
                 exclude: tuple = (), block: tuple = (), base: MarketSnapshot | None = None,
                 allow_preemption: bool = False) -> None:
        self.request, self.start, self.end, self.window_start = request, start, end, window_start
        self.exclude, self.block, self.base, self.allow_preemption = exclude, block, base, allow_preemption
        self.snap: Snapshot | None = None

    def decide(self) -> Decision:
        ms, self.base = (self.base or fresh()), None
        with view(ms, start=self.start, end=self.end, window_start=self.window_start, exclude=self.exclude) as snap:
            self.snap = snap
            blocked = {u: [PlacedInstance(None, 0, None, "reserved")] for u in self.block if u in snap.gpu_ids}
            with snap.pool.overlay(blocked):
                return decide(snapshot=snap, request=self.request, allow_preemption=self.allow_preemption)


class SlicesClaim(_Viewed, SliceClaim):
    """Slices carved now for an order over [start, end) (its span); the holds are read again under each
    GPU's lock (`holds_for`)."""

    def __init__(self, *, holds_for: HoldsFor, **kw) -> None:
        _Viewed.__init__(self, **kw)
        self.holds_for = holds_for


def _window_free(gpu: Gpu, slots: Slots, start: datetime, end: datetime, exclude: tuple = ()) -> None:
    from .holds import overlapping_reservations

    # The node (read and locked with the GPU) may have been deleted since the snapshot: a window there is lost.
    if gpu.node.status == Node.Status.DELETED:
        raise LostRace(f"{gpu.node} was deleted by its provider")
    if overlapping_reservations(gpu_id=gpu.pk, slots=slots, start=start, end=end, exclude=exclude).exists():
        raise LostRace("another reservation took these slots for part of the window")


def _placed_slots(gpu: Gpu, p: Placement) -> tuple[str, Slots]:
    """(profile to carve, slots) of a placement: a whole MIG GPU is its full profile at 0."""
    geometry = gpu.geometry()
    if geometry is None:
        return "", Slots.whole()
    profile = p.profile or geometry.full_profile.name
    return profile, Slots.of(geometry, profile, p.start if p.profile else 0)


class WindowClaim(_Viewed, Generic[T]):
    """Book [start, end) where the engine places it: `write(gpu, node, profile, slots)` under the GPU's lock,
    after the window is re-checked free there."""

    def __init__(self, *, write: Callable[[Gpu, Node, str, Slots], T], **kw) -> None:
        super().__init__(window_start=kw["start"], **kw)
        self.write = write

    def take(self, decision: Decision) -> T:
        p = decision.placements[0]
        # Lock the GPU row: the race is two bookings (or a booking and a claim) on these slots.
        gpu = Gpu.objects.select_for_update().select_related("node").get(pk=self.snap.gpu_ids[p.gpu_uuid])
        profile, slots = _placed_slots(gpu, p)
        _window_free(gpu, slots, self.start, self.end)
        try:
            with transaction.atomic():
                return self.write(gpu, gpu.node, profile, slots)
        except IntegrityError as exc:  # PostgreSQL's exclusion constraint: an overlap slipped by
            raise LostRace("another reservation took these slots") from exc


def relocation_request(r: Reservation) -> Request:
    """The engine's Request for another slice of a reservation's unit: its model, profile and region."""
    gpu = r.gpu
    whole = not r.profile or (gpu.geometry() is not None and r.profile == gpu.geometry().full_profile.name)
    return Request(models=frozenset([gpu.gpu_model.key]), regions=frozenset([gpu.node.region]), mode="reserved",
                   whole_gpu=whole, profile=None if whole else r.profile)


class RelocationClaim(_Viewed):
    """Move reservation `r` (locked by the caller) to another legal slice of its unit, free of other
    reservations for the rest of its window, and carve it there now. Returns the new slice."""

    def __init__(self, *, r: Reservation, now: datetime, avoid: tuple = ()) -> None:
        super().__init__(request=relocation_request(r), start=now, end=r.ends_at, exclude=(r.pk,), block=avoid)
        self.r = r

    def take(self, decision: Decision) -> Slice:
        p = decision.placements[0]
        r = self.r
        # Lock the GPU: the race is a booking or a claim on these slots while the window moves here.
        gpu = Gpu.objects.select_for_update().select_related("node").get(pk=self.snap.gpu_ids[p.gpu_uuid])
        profile, slots = _placed_slots(gpu, p)
        _window_free(gpu, slots, self.start, self.end, exclude=(r.pk,))
        start = start_under_lock(gpu, profile or None, slots.start, []) if profile else None
        try:
            with transaction.atomic():
                sl = slice_create(gpu_id=gpu.pk, profile=profile or None, start=start)
                slots = sl.slots if profile else slots
                Reservation.objects.filter(pk=r.pk).update(gpu=gpu, slot_start=slots.start, slot_end=slots.end)
        except (Conflict, IntegrityError) as exc:  # IntegrityError: PostgreSQL's exclusion constraint
            raise LostRace(str(exc)) from exc
        r.gpu, r.slot_start, r.slot_end = gpu, slots.start, slots.end
        return sl


class ListingClaim(Generic[T]):
    """A listed window changes hands: the listing is located on its reservation (which another sale may split
    meanwhile, moving the listing to a piece), then the reservation, the listing and the GPU are locked in
    that order and `write(reservation, listing)` runs once the listing is still where it was seen."""

    def __init__(self, *, listing_id, write: Callable[[Reservation, ResaleListing], T]) -> None:
        self.listing_id, self.write = listing_id, write
        self.reservation_id = None

    def decide(self) -> Decision:
        row = (ResaleListing.objects.filter(pk=self.listing_id)
               .values_list("reservation_id", "reservation__gpu__uuid", "reservation__gpu__node_id",
                            "reservation__profile", "reservation__slot_start").first())
        if row is None:
            raise NotFound("no such listing", field="listing")
        self.reservation_id, gpu_uuid, node_id, profile, start = row
        return Decision(ok=True, placements=[Placement(str(node_id), gpu_uuid, profile or None, start)])

    def take(self, decision: Decision) -> T:
        # Lock the reservation first: a sale of another of its listings splits it and moves this listing to
        # a piece under the reservation's lock; locking the listing first would deadlock against that split.
        r = Reservation.objects.select_for_update().get(pk=self.reservation_id)
        listing = ResaleListing.objects.select_for_update().get(pk=self.listing_id)
        if listing.reservation_id != r.pk:
            raise LostRace("the listing moved to a piece of its reservation")
        # Lock the GPU: the race is a booking or a claim on these slots while the window changes hands.
        Gpu.objects.select_for_update().get(pk=r.gpu_id)
        return self.write(r, listing)
