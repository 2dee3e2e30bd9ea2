"""What holds capacity, as the market sees it: the span an order would occupy, the reserved windows that
are taken capacity over that span, and what each slice is for the engine (lease, class).

Reserved windows are capacity that is taken (DESIGN §5 class order): a placement that would still run when
a reservation on the same memory slices starts is refused, and spot leases in a reservation's way are
interrupted before it starts (products/reservations.py).
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from marketplace.conf import market
from marketplace.models import Lease, Mode, Order, Reservation, Workload
from scheduler.core.model import Request
from scheduler.core.slots import Slots
from scheduler.models import Slice
from scheduler.services.allocation import Hold, Occupant

FAR_FUTURE = datetime(9999, 1, 1, tzinfo=timezone.get_fixed_timezone(0))


def provision_allowance() -> float:
    """Seconds allowed for carving an instance: a lease with a duration holds its slots for duration + this."""
    return float(market("PROVISION_ALLOWANCE_SECONDS"))


def spot_clear_horizon() -> float:
    """How far ahead of a reservation's start its slots are cleared of spot leases (notice + ticks)."""
    return market("SPOT_NOTICE_SECONDS") + 2 * market("LEASE_TICK_SECONDS") + 10


def hold_span(*, mode: str, now: datetime, duration_seconds: int | None,
              window: tuple[datetime, datetime] | None = None) -> tuple[datetime, datetime]:
    """The span a new placement would occupy: reservations overlapping it are taken capacity.

    A reserved window is its window. On demand runs until its duration ends (counted from running, so the
    slots are held for the time carving may take too), or indefinitely without one. Spot only needs the
    slots until a reservation's notice would begin: later reservations interrupt it in time instead."""
    if window is not None:
        return window
    if mode == Mode.SPOT:
        horizon = now + timedelta(seconds=spot_clear_horizon())
        end = now + timedelta(seconds=duration_seconds + provision_allowance()) if duration_seconds else horizon
        return now, min(end, horizon)
    if not duration_seconds:
        return now, FAR_FUTURE
    return now, now + timedelta(seconds=duration_seconds + provision_allowance())


def order_span(order: Order, *, now: datetime) -> tuple[datetime, datetime]:
    window = (order.window_start, order.window_end) if order.mode == Mode.RESERVED else None
    return hold_span(mode=order.mode, now=now, duration_seconds=order.duration_seconds, window=window)


def live_reservations(*, start: datetime, end: datetime, gpu_id: int | None = None, exclude: tuple = ()):
    """Live reservations whose window overlaps [start, end)."""
    qs = Reservation.objects.filter(state__in=Reservation.LIVE_STATES, starts_at__lt=end, ends_at__gt=start)
    if gpu_id is not None:
        qs = qs.filter(gpu_id=gpu_id)
    if exclude:
        qs = qs.exclude(pk__in=exclude)
    return qs


def reservation_holds(*, start: datetime, end: datetime, gpu_id: int | None = None,
                      exclude: tuple = ()) -> list[Hold]:
    """Live reservations whose window overlaps [start, end), as holds on their GPU's slots."""
    return [Hold(gpu_id=g, profile=p or None, start=s) for g, p, s in
            live_reservations(start=start, end=end, gpu_id=gpu_id, exclude=exclude)
            .values_list("gpu_id", "profile", "slot_start")]


def overlapping_reservations(*, gpu_id: int, slots: Slots, start: datetime, end: datetime, exclude: tuple = ()):
    """Live reservations on `gpu_id` sharing a memory slice and a moment with the given window."""
    return live_reservations(start=start, end=end, gpu_id=gpu_id, exclude=exclude).filter(
        slot_start__lt=slots.end, slot_end__gt=slots.start)


def holds_for(*, start: datetime, end: datetime, exclude: tuple = ()):
    """The holds on one GPU over [start, end), read again under its row lock by a claim."""
    return lambda gpu_id: reservation_holds(start=start, end=end, gpu_id=gpu_id, exclude=exclude)


class LeaseClasses:
    """What each active slice is for the engine, from one query of the open leases. For a future window (a
    booking), slices that will be gone by then (spot: interrupted first; ending; leases ending before it)
    do not count."""

    def __init__(self) -> None:
        self.rows = {sl: (lid, mode, ends, state) for lid, sl, mode, ends, state in Lease.objects.filter(
            state__in=Lease.OPEN_STATES).values_list("id", "slice_id", "mode", "ends_at", "state")}

    def occupant(self, sl, *, window_start: datetime | None = None) -> Occupant | None:
        row = self.rows.get(sl.pk)
        if row is None:
            # No lease: a provider's hand-made or adopted instance, or one still being destroyed.
            if window_start is not None and sl.state == Slice.State.DESTROYING:
                return None
            return Occupant()
        lease_id, mode, ends, state = row
        if window_start is not None:
            if mode == Mode.SPOT or state in (Lease.State.ENDING, Lease.State.INTERRUPTING):
                return None
            if ends is not None and ends <= window_start:
                return None
        if mode == Mode.SPOT:
            return Occupant(lease_id=str(lease_id), priority="spot")
        return Occupant(lease_id=str(lease_id), priority="reserved" if mode == Mode.RESERVED else "on_demand")

    def leaves_before(self, sl, window_start: datetime) -> bool:
        """Whether `sl` no longer counts for a window starting at `window_start`."""
        return self.occupant(sl, window_start=window_start) is None


def request_for(order: Order, *, now: datetime | None = None, image: str | None = None) -> Request:
    """The engine's Request for an order (`image`: the container it runs, for the RunsImage filter; by default
    its workload's, if it has one; "" for none, without looking it up)."""
    if image is None and order.pk is not None:
        image = Workload.objects.filter(order_id=order.pk).values_list("image", flat=True).first()
    mode = {Mode.RESERVED: "reserved", Mode.SPOT: "spot"}.get(order.mode, "on_demand")
    short = False
    if order.mode == Mode.RESERVED and order.window_start is not None:
        short = (order.window_start - (now or timezone.now())).total_seconds() < market("RESERVED_AHEAD_SECONDS")
    return Request(
        models=frozenset(order.gpu_models) or None, memory_gb=order.memory_gb,
        compute_slices=order.compute_slices, whole_gpu=order.whole_gpu or order.gpu_count > 1,
        gpu_count=order.gpu_count or 1,
        min_cuda=order.min_cuda or None, min_compute_capability=order.min_compute_capability or None,
        regions=frozenset(order.regions) or None, buyer_region=order.buyer_region or None, mode=mode,
        max_price_per_hour=float(order.max_price_per_hour) if order.max_price_per_hour is not None else None,
        priority=order.priority, short_notice=short, image=image or None)
