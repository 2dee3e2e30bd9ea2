"""Reserved capacity: a window booked ahead on a concrete GPU, profile and start, paid when booked
(RESERVED_FACTOR × base × share when at least RESERVED_AHEAD_SECONDS ahead, else the short-notice factor),
to the micro-dollar. Never overbooked: the booking re-checks overlaps under the GPU's row lock (every
database), and PostgreSQL's exclusion constraint refuses what slips by. The beat clears spot leases off the
slots before the window, starts the lease at its start, ends it at its end; the window is the holder's
whether used or not. A window whose lease the platform lost is placed again for the rest of its span and the
time not delivered is refunded pro rata when it ends.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from marketplace.amounts import cost, micro
from marketplace.claims import snapshot
from marketplace.claims.holds import live_reservations, order_span, request_for, spot_clear_horizon
from marketplace.claims.refusals import refusal
from marketplace.claims.windows import RelocationClaim, WindowClaim
from marketplace.conf import market
from marketplace.lifecycle.leases import LOST_REASONS, lease_end, lease_interrupt, lease_open
from marketplace.models import LedgerTransaction, Lease, Mode, Order, ResaleListing, Reservation
from marketplace.money import movements
from marketplace.pricing import price_for, reserved_mode
from scheduler.core.slots import Slots
from scheduler.errors import Conflict, DomainError, NotFound
from scheduler.models import Gpu, Node, Slice
from scheduler.services.allocation import allocate, legal_starts_among
from scheduler.services.slices import slice_create


def reservation_book(*, order: Order, now: datetime, base: snapshot.MarketSnapshot | None = None) -> bool:
    """Book `order`'s window where the engine places it and charge it; False (with reasons on the order) when
    nothing is free for the whole window. Runs inside the order's transaction."""
    start, end = order_span(order, now=now)
    mode = reserved_mode(starts_at=order.window_start, now=now)
    seconds = (order.window_end - order.window_start).total_seconds()

    def write(gpu, node, profile, slots):
        per_hour = price_for(mode=mode, base_per_gpu_hour=node.price_per_gpu_hour, geometry=gpu.geometry(),
                             profile=profile or None)
        total = cost(per_hour=per_hour, seconds=seconds)
        r = Reservation.objects.create(
            holder=order.buyer, order=order, gpu=gpu, profile=profile, slot_start=slots.start,
            slot_end=slots.end, starts_at=order.window_start, ends_at=order.window_end,
            price_per_hour=per_hour, price_total=total)
        if total > 0:
            movements.charge(kind="reservation", buyer=order.buyer, provider=node.provider_id, amount=total,
                             idempotency_key=f"reservation:{r.pk}", order=order.pk, project=order.project_id,
                             memo=f"reservation {str(r.pk)[:8]} {profile or gpu.name} {seconds / 3600:g} h")
        return r

    claim = WindowClaim(request=request_for(order, now=now), start=start, end=end, base=base, write=write)
    decision, r = allocate(claim=claim, retries=market("PLACE_RETRIES"))
    if r is None:
        order.reasons, order.explain = decision.reasons, refusal(request=claim.request, reasons=decision.reasons)[:500]
        return False
    order.state, order.placed_at = Order.State.PLACED, now
    order.price_per_hour, order.total_price, order.reasons, order.explain = r.price_per_hour, r.price_total, {}, ""
    order.save(update_fields=["state", "placed_at", "price_per_hour", "total_price", "reasons", "explain",
                              "attempts"])
    return True


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
    horizon = now + timedelta(seconds=spot_clear_horizon())
    clear = timedelta(seconds=2 * market("LEASE_TICK_SECONDS"))
    soon = list(Reservation.objects.filter(state=Reservation.State.BOOKED, starts_at__lte=horizon,
                                           ends_at__gt=now))
    if not soon:
        return
    spot = list(Lease.objects.filter(mode=Mode.SPOT, state__in=[Lease.State.RUNNING, Lease.State.PROVISIONING],
                                     slice__gpu_id__in={r.gpu_id for r in soon}).select_related("slice"))
    for r in soon:
        window = Slots(r.slot_start, r.slot_end)
        for lease in spot:
            if lease.slice.gpu_id == r.gpu_id and lease.slice.slots.overlaps(window):
                lease_interrupt(lease_id=lease.pk, kind="reservation", now=now,
                                deadline=max(now, r.starts_at - clear))


def _start(reservation_id, now: datetime) -> None:
    """Open the window's lease: on its own GPU and slots, or, where they cannot be carved now (after a failed
    provision there first), on another legal slice of its unit (RelocationClaim)."""
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
        sl = _relocate(r, now) if failed_here else None
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


def _relocate(r: Reservation, now: datetime) -> Slice | None:
    """Another legal slice of the same unit (GPU model, profile, region) on an online node, free of other
    reservations for the rest of the window, carved now; the reservation moves there. None when none is."""
    _, sl = allocate(claim=RelocationClaim(r=r, now=now, avoid=(r.gpu.uuid,)), retries=market("PLACE_RETRIES"))
    return sl


def late_start_after() -> timedelta:
    """How long after its window's start the platform may open the window's lease and still be on time: two beat
    ticks and the margin the spot clearing keeps for a busy worker (spot_clear_horizon). Later, the beat or the
    workers were down: the time until the lease ran was not delivered."""
    return timedelta(seconds=2 * market("LEASE_TICK_SECONDS") + 10)


def undelivered_seconds(r: Reservation) -> float:
    """Seconds of `r`'s window lost by the platform, each counted once: from the window's start until its first
    lease started when the platform opened that lease late (`late_start_after`), and from each lost lease's end (or
    the window's start) until the next lease of the window started (or the window ended). A window no lease ever ran
    in is all lost."""
    leases = list(r.leases.order_by("created_at"))
    if not any(lease.started_at for lease in leases):
        return (r.ends_at - r.starts_at).total_seconds()

    def running_again(after: list[Lease]) -> datetime:
        return next((x.started_at for x in after if x.started_at), None) or r.ends_at

    gaps = []
    # Measured from the booking when the window was booked after its start (a window may start up to a minute ago).
    due = max(r.starts_at, r.created_at)
    if leases[0].created_at - due > late_start_after():
        gaps.append((due, running_again(leases)))
    for i, lease in enumerate(leases):
        if lease.state == Lease.State.FAILED or lease.end_reason in LOST_REASONS:
            gaps.append((max(lease.ended_at or r.starts_at, r.starts_at), running_again(leases[i + 1:])))
    return _seconds_covered(gaps, start=r.starts_at, end=r.ends_at)


def _seconds_covered(spans: list[tuple[datetime, datetime]], *, start: datetime, end: datetime) -> float:
    """Seconds of [start, end) inside the union of `spans` (overlapping spans count once)."""
    total, reached = 0.0, start
    for a, b in sorted(spans):
        a, b = max(a, reached), min(b, end)
        if b > a:
            total += (b - a).total_seconds()
            reached = b
    return total


def _finish(reservation_id, now: datetime) -> None:
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
            amount = min(r.price_total, micro(r.price_total * Decimal(str(lost)) / window))
            if amount > 0:
                _refund_undelivered(r, amount=amount, seconds=lost)


def _refund_undelivered(r: Reservation, *, amount: Decimal, seconds: float) -> None:
    """The platform did not deliver `seconds` of the window (node offline, failed provision): the holder gets
    `amount` back once (one idempotency key per reservation), from the provider where the booking charge can
    be reversed, else as a platform credit."""
    # The piece that was paid for: the original booking (its holder's charge is reversed), or a window bought on
    # resale (then the price is credited).
    root = _paid_root(r)
    original = LedgerTransaction.objects.filter(idempotency_key=f"reservation:{root.pk}").first()
    key = f"reservation-refund:{r.pk}"
    memo = (f"reservation {str(r.pk)[:8]} was not delivered" if seconds >= (r.ends_at - r.starts_at).total_seconds()
            else f"reservation {str(r.pk)[:8]}: {seconds:.0f} s of its window were not delivered")
    if original is not None and not hasattr(root, "bought_from"):
        movements.refund(original=original, idempotency_key=key, amount=amount, memo=memo)
    else:
        movements.credit(user=r.holder, amount=amount, idempotency_key=key, memo=memo)


# --- cancelling: the policy a buyer of reserved capacity expects (docs/market.md, "Cancelling a window") --------

@dataclass
class CancelTerms:
    """What cancelling a reservation now would do: `refund` of its `paid` price back (`share` of it), or why it
    cannot be cancelled (`refused`, a sentence; the holder lists it for resale instead)."""

    paid: Decimal
    share: Decimal = Decimal("0")
    refund: Decimal = Decimal("0")
    why: str = ""  # the rule that applies, in the buyer's words
    refused: str = ""
    code: str = ""


def _paid_root(r: Reservation) -> Reservation:
    """The piece that was paid for: the original booking, or a window bought on the resale market (the pieces a
    resale split off keep the booking's charge). Walking past a bought piece to the first booking would refund the
    first seller for a window that a later buyer paid for."""
    root = r
    while root.parent_id is not None and not hasattr(root, "bought_from"):
        root = root.parent
    return root


def cancel_terms(*, reservation: Reservation, now: datetime | None = None) -> CancelTerms:
    """The cancel policy applied to `reservation` now: the whole price back until RESERVATION_FREE_CANCEL_SECONDS
    before its start or within RESERVATION_CANCEL_GRACE_SECONDS of booking it; later, until the start,
    RESERVATION_LATE_CANCEL_REFUND of it; after the start, nothing (resell the rest instead). A window bought on the
    resale market is resold, not cancelled (its seller has been paid)."""
    now = now or timezone.now()
    r = reservation
    terms = CancelTerms(paid=r.price_total)
    if r.state != Reservation.State.BOOKED or r.starts_at <= now:
        started = r.state == Reservation.State.ACTIVE or (r.state == Reservation.State.BOOKED and r.starts_at <= now)
        terms.refused, terms.code = ((f"The window started at {r.starts_at:%H:%M} UTC on {r.starts_at:%b} {r.starts_at.day}: a reservation is not "
                                      "cancelled once it has started; list the rest of it for resale instead.",
                                      "window_started") if started else
                                     (f"The reservation is {r.get_state_display()}: there is nothing to cancel.",
                                      "not_cancellable"))
        return terms
    if hasattr(_paid_root(r), "bought_from"):
        terms.refused, terms.code = ("A window bought on the resale market is not cancelled (its seller has been "
                                     "paid): list it for resale instead.", "bought_on_resale")
        return terms
    ahead = (r.starts_at - now).total_seconds()
    booked = _paid_root(r).created_at
    free_before = market("RESERVATION_FREE_CANCEL_SECONDS")
    if ahead >= free_before:
        terms.share, terms.why = Decimal("1"), f"cancelled at least {_span(free_before)} before its start: all of it"
    elif (now - booked).total_seconds() <= market("RESERVATION_CANCEL_GRACE_SECONDS"):
        terms.share, terms.why = Decimal("1"), (f"cancelled within {_span(market('RESERVATION_CANCEL_GRACE_SECONDS'))} "
                                                f"of booking: all of it")
    else:
        terms.share = Decimal(market("RESERVATION_LATE_CANCEL_REFUND"))
        terms.why = (f"cancelled less than {_span(free_before)} before its start: "
                     f"{float(terms.share) * 100:g}% of it")
    terms.refund = micro(r.price_total * terms.share)
    return terms


def cancel_policy() -> str:
    """The cancel policy in one sentence, from the settings (what `cancel_terms` applies)."""
    late = float(market("RESERVATION_LATE_CANCEL_REFUND")) * 100
    return (f"A booked window is refunded in full when cancelled at least {_span(market('RESERVATION_FREE_CANCEL_SECONDS'))}"
            f" before it starts or within {_span(market('RESERVATION_CANCEL_GRACE_SECONDS'))} of booking it; "
            f"{late:g}% of it later, until it starts; once started it is not cancelled: list the rest for resale.")


def _span(seconds: float) -> str:
    """A policy's period in words: "a day", "2 days", "10 minutes"."""
    s = int(seconds)
    for unit, name in ((86400, "day"), (3600, "hour")):
        if s and s % unit == 0:
            n = s // unit
            return f"a{'n' if name == 'hour' else ''} {name}" if n == 1 else f"{n} {name}s"
    return f"{max(1, round(s / 60))} minutes"


def reservation_cancel(*, holder, reservation_id, now: datetime | None = None) -> tuple[Reservation, CancelTerms]:
    """Cancel the holder's booked window by the cancel policy (`cancel_terms`): its slots are free again, its open
    resale listings withdrawn, and the refund due goes back to the wallet from the booking's charge (pro rata from
    the provider and the platform fee, marketplace.money), once."""
    now = now or timezone.now()
    with transaction.atomic():
        # Lock the reservation: the race is its start (the beat opening its lease), a resale purchase splitting it,
        # or a second cancel; each of those locks it first too.
        r = (Reservation.objects.select_for_update(of=("self",)).select_related("order")
             .filter(pk=reservation_id, holder=holder).exclude(state=Reservation.State.SPLIT).first())
        if r is None:
            raise NotFound("no such reservation among yours", field="reservation")
        terms = cancel_terms(reservation=r, now=now)
        if terms.refused:
            raise Conflict(terms.refused, code=terms.code)
        r.state = Reservation.State.CANCELLED
        r.save(update_fields=["state"])
        r.listings.filter(state=ResaleListing.State.OPEN).update(state=ResaleListing.State.CANCELLED)
        if terms.refund > 0:
            original = LedgerTransaction.objects.get(idempotency_key=f"reservation:{_paid_root(r).pk}")
            movements.refund(original=original, idempotency_key=f"reservation-cancel:{r.pk}", amount=terms.refund,
                             memo=f"reservation {str(r.pk)[:8]} cancelled: {terms.why} refunded")
        if r.order_id and not r.order.reservations.filter(state__in=Reservation.LIVE_STATES).exists():
            Order.objects.filter(pk=r.order_id).update(state=Order.State.CANCELLED)
    return r, terms


CALENDAR_DAYS = 7


def free_calendar(*, gpu_model: str, profile: str | None, region: str, now: datetime | None = None) -> dict:
    """Hour by hour over the next days: could a window of `profile` (None: a whole GPU) on this unit be booked
    then? The same rule a booking's claim checks under its lock (allocation.legal_starts_among) over the
    unit's GPUs, their live reservations and their open leases that are not spot (a few queries)."""
    now = now or timezone.now()
    first = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    last = first + timedelta(days=CALENDAR_DAYS)
    gpus = list(Gpu.objects.filter(present=True, gpu_model__key=gpu_model, node__region=region,
                                   node__status=Node.Status.ONLINE).exclude(health=Gpu.Health.CORDONED))
    busy: dict[int, list[tuple[str | None, int, datetime, datetime]]] = {g.pk: [] for g in gpus}
    for gpu_id, p, start, s, e in live_reservations(start=first, end=last).filter(gpu_id__in=busy).values_list(
            "gpu_id", "profile", "slot_start", "starts_at", "ends_at"):
        busy[gpu_id].append((p or None, start, s, e))
    for gpu_id, p, start, ends in (Slice.objects.filter(gpu_id__in=busy, state__in=Slice.ACTIVE_STATES)
                                   .exclude(lease__mode=Mode.SPOT)
                                   .exclude(lease__state__in=[Lease.State.ENDING, Lease.State.INTERRUPTING])
                                   .values_list("gpu_id", "profile", "start", "lease__ends_at")):
        busy[gpu_id].append((p or None, start or 0, now, ends or last))

    def free_at(t0: datetime, t1: datetime) -> bool:
        for gpu in gpus:
            geometry = gpu.geometry()
            occupied = [(p if geometry is not None else None, s) for p, s, a, b in busy[gpu.pk] if a < t1 and b > t0]
            if legal_starts_among(geometry, profile if geometry is not None else None, occupied):
                return True
        return False

    day0 = datetime.combine(first.date(), datetime.min.time(), tzinfo=first.tzinfo)
    days = [day0 + timedelta(days=d) for d in range(CALENDAR_DAYS)]
    rows = []
    for h in range(24):
        cells = []
        for day in days:
            t0 = day + timedelta(hours=h)
            t1 = t0 + timedelta(hours=1)
            cells.append({"start": t0, "end": t1,
                          "state": "past" if t0 < first else ("free" if free_at(t0, t1) else "busy")})
        rows.append({"hour": h, "cells": cells})
    return {"days": days, "rows": rows, "unit": {"gpu_model": gpu_model, "profile": profile or "whole",
                                                 "region": region}, "gpus": len(gpus)}
