"""The market's view of capacity for the scheduler: what each slice is (lease, class), which reserved
windows hold capacity for a given span of time, the engine Request of an order, and slice prices.

Reserved windows are capacity that is taken (DESIGN §5 class order): a placement that would still run
when a reservation on the same memory slices starts is refused, and spot leases in a reservation's way
are interrupted before it starts (reservations.reservations_tick).
"""
from __future__ import annotations

from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from marketplace.models import Lease, Mode, Order, Reservation
from scheduler.core import pricing
from scheduler.core.mig import MigGeometry
from scheduler.core.model import Request
from scheduler.models import Gpu, Node, Slice
from scheduler.services import allocation

MICRO = Decimal("0.000001")
CENT = Decimal("0.01")
FAR_FUTURE = datetime(9999, 1, 1, tzinfo=timezone.get_fixed_timezone(0))


def market(name: str):
    return settings.MARKET[name]


def micro(value) -> Decimal:
    return Decimal(value).quantize(MICRO, rounding=ROUND_HALF_UP)


def cents(value) -> Decimal:
    return Decimal(value).quantize(CENT, rounding=ROUND_HALF_UP)


# --- prices (DESIGN §5, via scheduler.core.pricing) -------------------------------------------------------

def share_of(geometry: MigGeometry | None, profile: str | None) -> Decimal:
    return Decimal(repr(pricing.slice_share(geometry=geometry, profile=profile or None)))


def on_demand_price(*, node: Node, geometry: MigGeometry | None, profile: str | None) -> Decimal:
    """1.8 × base × share, per hour."""
    return micro(node.price_per_gpu_hour * share_of(geometry, profile) * Decimal(str(pricing.ON_DEMAND_FACTOR)))


def reserved_price(*, node: Node, geometry: MigGeometry | None, profile: str | None, starts_at: datetime,
                   now: datetime) -> Decimal:
    """0.85 × base × share when booked at least an hour ahead, else base × share, per hour."""
    ahead = (starts_at - now).total_seconds() >= market("RESERVED_AHEAD_SECONDS")
    factor = Decimal(str(pricing.RESERVED_FACTOR)) if ahead else Decimal("1")
    return micro(node.price_per_gpu_hour * share_of(geometry, profile) * factor)


def spot_price(*, node: Node, geometry: MigGeometry | None, profile: str | None, factor: Decimal) -> Decimal:
    """The spot factor (50%..70%) × the on-demand price, per hour."""
    return micro(on_demand_price(node=node, geometry=geometry, profile=profile) * factor)


def spot_factor_now(*, free_share: float) -> Decimal:
    return Decimal(str(round(pricing.spot_factor(free_share=free_share), 4)))


def cost(*, per_hour: Decimal, seconds: float) -> Decimal:
    return cents(per_hour * Decimal(str(seconds)) / Decimal(3600))


# --- what holds capacity ------------------------------------------------------------------------------------

def reservation_holds(*, start: datetime, end: datetime, gpu_id: int | None = None,
                      exclude: tuple = ()) -> list[allocation.Hold]:
    """Live reservations whose window overlaps [start, end), as holds on their GPU's slots."""
    qs = Reservation.objects.filter(state__in=Reservation.LIVE_STATES, starts_at__lt=end, ends_at__gt=start)
    if gpu_id is not None:
        qs = qs.filter(gpu_id=gpu_id)
    if exclude:
        qs = qs.exclude(pk__in=exclude)
    return [allocation.Hold(gpu_id=g, profile=p or None, start=s)
            for g, p, s in qs.values_list("gpu_id", "profile", "slot_start")]


def hold_window(*, mode: str, now: datetime, duration_seconds: int | None,
                window: tuple[datetime, datetime] | None = None) -> tuple[datetime, datetime]:
    """The span a new placement would occupy: reservations overlapping it are taken capacity.

    On demand runs until its duration ends, or indefinitely without one. Spot only needs the slots until a
    reservation's notice would begin: later reservations interrupt it in time instead."""
    if window is not None:
        return window
    if mode == Mode.SPOT:
        horizon = now + timedelta(seconds=spot_clear_horizon())
        end = now + timedelta(seconds=duration_seconds + provision_allowance()) if duration_seconds else horizon
        return now, min(end, horizon)
    if not duration_seconds:
        return now, FAR_FUTURE
    # The duration counts from running, not from the order: the slots are held for the time it may take to
    # carve the instance too.
    return now, now + timedelta(seconds=duration_seconds + provision_allowance())


def provision_allowance() -> float:
    """Seconds allowed for carving an instance: a lease with a duration holds its slots for duration + this."""
    return float(settings.MARKET["PROVISION_ALLOWANCE_SECONDS"])


def spot_clear_horizon() -> float:
    """How far ahead of a reservation's start its slots are cleared of spot leases (notice + ticks)."""
    return market("SPOT_NOTICE_SECONDS") + 2 * market("LEASE_TICK_SECONDS") + 10


def lease_classifier(*, window_start: datetime | None = None):
    """What each active slice is for the engine. For a future window (a booking), slices that will be gone
    by then (spot: preempted; leases ending before it) do not count."""
    rows = {sl: (lid, mode, ends, state) for lid, sl, mode, ends, state in Lease.objects.filter(
        state__in=Lease.OPEN_STATES).values_list("id", "slice_id", "mode", "ends_at", "state")}

    def classify(sl: Slice) -> allocation.Occupant | None:
        row = rows.get(sl.pk)
        if row is None:
            # No lease: a provider's hand-made or adopted instance, or one still being destroyed.
            if sl.state == Slice.State.DESTROYING and window_start is not None:
                return None
            return allocation.Occupant()
        lease_id, mode, ends, state = row
        if window_start is not None:
            if mode == Mode.SPOT or state in (Lease.State.ENDING, Lease.State.INTERRUPTING):
                return None
            if ends is not None and ends <= window_start:
                return None
        if mode == Mode.SPOT:
            return allocation.Occupant(lease_id=str(lease_id), priority="spot")
        return allocation.Occupant(lease_id=str(lease_id), priority="reserved" if mode == Mode.RESERVED
                                   else "on_demand")
    return classify


def request_for(order: Order) -> Request:
    mode = {Mode.RESERVED: "reserved", Mode.SPOT: "spot"}.get(order.mode, "on_demand")
    return Request(
        models=frozenset(order.gpu_models) or None, memory_gb=order.memory_gb,
        compute_slices=order.compute_slices, whole_gpu=order.whole_gpu or order.gpu_count > 1,
        gpu_count=order.gpu_count or 1,
        min_cuda=order.min_cuda or None, min_compute_capability=order.min_compute_capability or None,
        regions=frozenset(order.regions) or None, buyer_region=order.buyer_region or None, mode=mode,
        max_price_per_hour=float(order.max_price_per_hour) if order.max_price_per_hour is not None else None,
        priority=order.priority)


def snapshot_for(*, order: Order, now: datetime) -> allocation.Snapshot:
    window = (order.window_start, order.window_end) if order.mode == Mode.RESERVED else None
    start, end = hold_window(mode=order.mode, now=now, duration_seconds=order.duration_seconds, window=window)
    classify = lease_classifier(window_start=start if order.mode == Mode.RESERVED else None)
    return allocation.pool_snapshot(models=order.gpu_models or None, classify=classify,
                                    holds=reservation_holds(start=start, end=end))


def holds_for_order(*, order: Order, now: datetime):
    window = (order.window_start, order.window_end) if order.mode == Mode.RESERVED else None
    start, end = hold_window(mode=order.mode, now=now, duration_seconds=order.duration_seconds, window=window)
    return lambda gpu_id: reservation_holds(start=start, end=end, gpu_id=gpu_id)


def placement_facts(*, snapshot: allocation.Snapshot, gpu_uuid: str) -> tuple[Gpu, Node, MigGeometry | None]:
    gpu = snapshot.gpus[gpu_uuid]
    return gpu, snapshot.nodes[str(gpu.node_id)], gpu.geometry()


def overlapping_reservations(*, gpu_id: int, slot_start: int, slot_end: int, start: datetime, end: datetime,
                             exclude: tuple = ()):
    """Live reservations on `gpu_id` sharing a memory slice and a moment with the given window."""
    return (Reservation.objects.filter(gpu_id=gpu_id, state__in=Reservation.LIVE_STATES,
                                       starts_at__lt=end, ends_at__gt=start)
            .filter(Q(slot_start__lt=slot_end) & Q(slot_end__gt=slot_start)).exclude(pk__in=exclude))
