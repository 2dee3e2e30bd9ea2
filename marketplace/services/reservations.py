"""Reserved capacity: a window booked ahead on a concrete GPU, profile and start, paid when booked
(0.85 × base when at least an hour ahead, else base). Never overbooked: the booking re-checks overlaps
under the GPU's row lock (every database), and PostgreSQL's exclusion constraint refuses what slips by.
The beat clears spot leases off the slots before the window, starts the lease at its start, ends it at its
end; the window is the holder's whether used or not.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Callable

from django.db import IntegrityError, transaction
from django.utils import timezone

from marketplace.models import LedgerTransaction, Lease, Mode, Order, Reservation
from marketplace.services import ledger
from scheduler.core.model import Request
from scheduler.errors import Conflict, DomainError
from scheduler.core import mig as core_mig
from scheduler.models import Gpu, Node, Slice
from scheduler.services import allocation
from scheduler.services.slices import slice_create

from . import capacity
from .capacity import market


def reserved_slots(gpu: Gpu, profile: str | None, start: int) -> tuple[str, int, int]:
    """(profile to carve, first memory slice, end memory slice) of a placement; a whole MIG GPU is its full
    profile, a non-MIG GPU is one slot."""
    geometry = gpu.geometry()
    if geometry is None:
        return "", 0, 1
    if profile is None:
        full = geometry.full_profile
        return full.name, 0, full.memory_slices
    return profile, start, start + geometry.profile(profile).memory_slices


def reservation_book(*, order: Order, snapshot: Callable[[], allocation.Snapshot], request: Request,
                     now: datetime) -> bool:
    """Book `order`'s window where the engine places it and charge it; False (with reasons) when nothing
    is free for the whole window. Runs inside the order's transaction."""
    for _ in range(market("PLACE_RETRIES") + 1):
        snap = snapshot()
        decision = allocation.decide(snapshot=snap, request=request, allow_preemption=False)
        if not decision.ok:
            order.reasons, order.explain = decision.reasons, decision.explain()[:500]
            return False
        p = decision.placements[0]
        gpu, node, geometry = capacity.placement_facts(snapshot=snap, gpu_uuid=p.gpu_uuid)
        profile, slot_start, slot_end = reserved_slots(gpu, p.profile, p.start)
        try:
            with transaction.atomic():
                # Lock the GPU row: the race is two bookings (or a booking and a claim) on these slots.
                Gpu.objects.select_for_update().get(pk=gpu.pk)
                if capacity.overlapping_reservations(gpu_id=gpu.pk, slot_start=slot_start, slot_end=slot_end,
                                                     start=order.window_start, end=order.window_end).exists():
                    raise Conflict("lost the race for these slots", code="lost_race")
                per_hour = capacity.reserved_price(node=node, geometry=geometry, profile=profile or None,
                                                   starts_at=order.window_start, now=now)
                seconds = (order.window_end - order.window_start).total_seconds()
                total = capacity.cost(per_hour=per_hour, seconds=seconds)
                r = Reservation.objects.create(
                    holder=order.buyer, order=order, gpu=gpu, profile=profile, slot_start=slot_start,
                    slot_end=slot_end, starts_at=order.window_start, ends_at=order.window_end,
                    price_per_hour=per_hour, price_total=total)
        except (Conflict, IntegrityError):  # IntegrityError: PostgreSQL's exclusion constraint
            continue
        if total > 0:
            ledger.charge(buyer=order.buyer, provider=node.provider, amount=total, kind="reservation",
                          idempotency_key=f"reservation:{r.pk}", order=order.pk, project=order.project,
                          memo=f"reservation {str(r.pk)[:8]} {profile or gpu.name} {seconds / 3600:g} h")
        order.state, order.placed_at = Order.State.PLACED, now
        order.price_per_hour, order.total_price, order.reasons, order.explain = per_hour, total, {}, ""
        order.save(update_fields=["state", "placed_at", "price_per_hour", "total_price", "reasons", "explain",
                                  "attempts"])
        return True
    order.reasons, order.explain = {"lost the race for capacity": 1}, "lost the race for capacity"
    return False


def _slots_of(sl: Slice) -> range:
    return range(0, 64) if not sl.size else range(sl.start, sl.start + sl.size)


def reservations_tick(*, now: datetime | None = None) -> None:
    """Beat: clear spot off soon-starting windows, start due windows, end and settle finished ones."""
    now = now or timezone.now()
    _clear_spot(now)
    for r_id in Reservation.objects.filter(state=Reservation.State.BOOKED, starts_at__lte=now,
                                           ends_at__gt=now).values_list("id", flat=True):
        _start(r_id, now)
    for r_id in Reservation.objects.filter(state__in=Reservation.LIVE_STATES, ends_at__lte=now).values_list(
            "id", flat=True):
        _finish(r_id, now)


def _clear_spot(now: datetime) -> None:
    """Spot leases on the slots of a window starting within the notice horizon get their notice now, so
    that they are gone when it starts (full notice when the booking came early enough, else a credit)."""
    from .spot import spot_interrupt

    horizon = now + timedelta(seconds=capacity.spot_clear_horizon())
    clear = timedelta(seconds=2 * market("LEASE_TICK_SECONDS"))
    soon = list(Reservation.objects.filter(state=Reservation.State.BOOKED, starts_at__lte=horizon,
                                           ends_at__gt=now))
    if not soon:
        return
    spot = list(Lease.objects.filter(mode=Mode.SPOT, state__in=[Lease.State.RUNNING, Lease.State.PROVISIONING],
                                     slice__gpu_id__in={r.gpu_id for r in soon}).select_related("slice"))
    for r in soon:
        for lease in spot:
            s = _slots_of(lease.slice)
            if lease.slice.gpu_id == r.gpu_id and s.start < r.slot_end and r.slot_start < s.stop:
                spot_interrupt(lease_id=lease.pk, kind="reservation", now=now,
                               deadline=max(now, r.starts_at - clear))


# Why a reserved window's lease can be lost through no fault of its holder: the window is re-placed for the
# rest of its span and the time it was not delivered is refunded pro rata (_finish).
LOST_REASONS = ("node offline", "provisioning failed")


def reservation_lost(*, reservation_id) -> None:
    """Its lease was lost mid-window (failed provision, node offline): back to booked, so the beat re-places it
    for the rest of the window (called inside the transaction that ended the lease)."""
    Reservation.objects.filter(pk=reservation_id, state=Reservation.State.ACTIVE).update(state=Reservation.State.BOOKED)


def _start(reservation_id, now: datetime) -> None:
    from .leases import lease_open

    try:
        with transaction.atomic():
            # Lock the reservation: the race is a second beat worker starting it too, or a resale splitting it.
            r = (Reservation.objects.select_for_update(skip_locked=True, of=("self",))
                 .select_related("holder", "order", "gpu__node", "gpu__gpu_model")
                 .filter(pk=reservation_id, state=Reservation.State.BOOKED).first())
            # A lost lease still being destroyed (its node offline) does not hold the window back.
            if r is None or r.leases.filter(state__in=Lease.OPEN_STATES).exclude(end_reason__in=LOST_REASONS).exists():
                return
            last = r.leases.order_by("-created_at").first()
            failed_here = last is not None and last.state == Lease.State.FAILED and last.slice.gpu_id == r.gpu_id
            sl = None
            if failed_here:  # carving failed on this GPU: try another slice of the unit before this one again
                sl = _relocate(r, now)
            if sl is None:
                try:
                    with transaction.atomic():
                        sl = slice_create(gpu_id=r.gpu_id, profile=r.profile or None,
                                          start=r.slot_start if r.profile else None)
                except DomainError:
                    if not failed_here:
                        sl = _relocate(r, now)
            if sl is None:
                return  # slots still held by a leaving lease, node offline, nothing else free: the next tick
            lease_open(order=r.order, buyer=r.holder, sl=sl, mode=Mode.RESERVED, price_per_hour=Decimal("0"),
                       ends_at=r.ends_at, reservation=r, now=now)
            r.state = Reservation.State.ACTIVE
            r.save(update_fields=["state"])
    except DomainError:
        return


def _relocate(r: Reservation, now: datetime) -> Slice | None:
    """Another legal slice of the same unit (GPU model, profile, region) on an online node, free of other
    reservations for the window: the reservation moves there. None when there is none."""
    old = r.gpu
    size = r.slot_end - r.slot_start
    candidates = (Gpu.objects.filter(gpu_model_id=old.gpu_model_id, node__region=old.node.region,
                                     node__status=Node.Status.ONLINE, present=True, mig_enabled=old.mig_enabled)
                  .exclude(pk=old.pk).order_by("pk"))
    for gpu in candidates:
        geometry = gpu.geometry()
        if r.profile and geometry is not None:
            if not geometry.has_profile(r.profile):
                continue
            starts = core_mig.legal_starts(geometry, [], r.profile)
        elif r.profile or geometry is not None:
            continue  # a MIG profile needs a MIG GPU, and a whole non-MIG GPU another non-MIG one
        else:
            starts = [0]
        for start in starts:
            try:
                with transaction.atomic():
                    # Lock the GPU: the race is a booking or a claim on these slots while the window moves here.
                    Gpu.objects.select_for_update().get(pk=gpu.pk)
                    if capacity.overlapping_reservations(gpu_id=gpu.pk, slot_start=start, slot_end=start + size,
                                                         start=r.starts_at, end=r.ends_at, exclude=(r.pk,)).exists():
                        continue
                    sl = slice_create(gpu_id=gpu.pk, profile=r.profile or None, start=start if r.profile else None)
                    Reservation.objects.filter(pk=r.pk).update(gpu=gpu, slot_start=start, slot_end=start + size)
            except (DomainError, IntegrityError):  # IntegrityError: PostgreSQL's exclusion constraint
                continue
            r.gpu, r.slot_start, r.slot_end = gpu, start, start + size
            return sl
    return None


def undelivered_seconds(r: Reservation) -> float:
    """Seconds of `r`'s window lost by the platform: from each lost lease's end (or the window's start) until
    the next lease of the window started (or the window ended). A window no lease ever ran in is all lost."""
    leases = list(r.leases.order_by("created_at"))
    window = (r.ends_at - r.starts_at).total_seconds()
    if not any(lease.started_at for lease in leases):
        return window
    lost = 0.0
    for i, lease in enumerate(leases):
        if lease.state != Lease.State.FAILED and lease.end_reason not in LOST_REASONS:
            continue
        gone = max(lease.ended_at or r.starts_at, r.starts_at)
        back = next((x.started_at for x in leases[i + 1:] if x.started_at), None) or r.ends_at
        lost += max(0.0, (min(back, r.ends_at) - gone).total_seconds())
    return min(lost, window)


def _finish(reservation_id, now: datetime) -> None:
    from .leases import lease_end

    with transaction.atomic():
        r = (Reservation.objects.select_for_update(skip_locked=True, of=("self",)).select_related("holder")
             .filter(pk=reservation_id, state__in=Reservation.LIVE_STATES).first())
        if r is None:
            return
        for lease_id in r.leases.filter(state__in=Lease.OPEN_STATES).values_list("id", flat=True):
            lease_end(lease_id=lease_id, reason="window over", at=min(now, r.ends_at))
        lost = undelivered_seconds(r)
        delivered = r.leases.filter(started_at__isnull=False).exists()
        r.state = Reservation.State.DONE if delivered else Reservation.State.REFUNDED
        r.save(update_fields=["state"])
        if lost > 0 and r.price_total > 0:
            window = Decimal(str((r.ends_at - r.starts_at).total_seconds()))
            amount = min(r.price_total, capacity.cents(r.price_total * Decimal(str(lost)) / window))
            if amount > 0:
                _refund_undelivered(r, amount=amount, seconds=lost)


def _refund_undelivered(r: Reservation, *, amount: Decimal, seconds: float) -> None:
    """The platform did not deliver `seconds` of the window (node offline, failed provision): the holder gets
    `amount` back once (one idempotency key per reservation), from the provider where the booking charge can
    be reversed, else as a platform credit."""
    # Walk up to the piece that was paid for: the original booking (its holder's charge is reversed), or
    # a window bought on resale (then the price is credited). Walking past a bought piece to the first
    # booking would refund the first seller for a window that a later buyer paid for.
    root = r
    while root.parent_id is not None and not hasattr(root, "bought_from"):
        root = root.parent
    original = LedgerTransaction.objects.filter(idempotency_key=f"reservation:{root.pk}").first()
    key = f"reservation-refund:{r.pk}"
    memo = (f"reservation {str(r.pk)[:8]} was not delivered" if seconds >= (r.ends_at - r.starts_at).total_seconds()
            else f"reservation {str(r.pk)[:8]}: {seconds:.0f} s of its window were not delivered")
    if original is not None and not hasattr(root, "bought_from"):
        ledger.refund(original=original, idempotency_key=key, amount=amount, memo=memo)
    else:
        ledger.credit(user=r.holder, amount=amount, idempotency_key=key, memo=memo)
