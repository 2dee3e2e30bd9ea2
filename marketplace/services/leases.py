"""Leases: opened on a claimed slice, running when the agent reports the instance, ended by the buyer, their
duration or window, an interruption, the wallet or the node. Billing stops when the lease stops for the
buyer (an end request or an interruption notice); the instance is destroyed after that.

The fleet's signals drive the state: slice_ready → running, slice_failed → failed and refunded,
slice_destroyed → ended, node_offline → ended (spot: interrupted without notice, so credited).
"""
from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from marketplace.models import Lease, LedgerTransaction, Mode, Order, Reservation, SpotBid
from marketplace.services import ledger
from scheduler.errors import NotFound
from scheduler.models import Slice
from scheduler.services.slices import slice_destroy

from . import capacity
from .metering import billing_start, meter_settle
from .notify import notify_webhook, tell_buyer


def connection_facts(lease: Lease) -> dict | None:
    """What the buyer's process needs: the node, the device UUID and CUDA_VISIBLE_DEVICES (once running)."""
    sl = lease.slice
    if lease.state != Lease.State.RUNNING and lease.state != Lease.State.INTERRUPTING:
        return None
    node = sl.gpu.node
    return {"node": str(node.pk), "hostname": node.hostname, "region": node.region, "gpu_uuid": sl.gpu.uuid,
            "device_uuid": sl.cuda_visible_devices, "mig_profile": sl.profile or None,
            "env": {"CUDA_VISIBLE_DEVICES": sl.cuda_visible_devices}}


SIBLING_FAILED = "another GPU of the order failed"


def _event(lease: Lease, kind: str, **extra) -> dict:
    return {"type": kind, "lease": str(lease.pk), "state": lease.state, "mode": lease.mode, **extra}


def lease_open(*, order: Order | None, buyer, sl: Slice, mode: str, price_per_hour: Decimal,
               ends_at: datetime | None, reservation: Reservation | None = None, bid: Decimal | None = None,
               now: datetime) -> Lease:
    """A lease on a just-claimed slice (called inside the placing transaction)."""
    lease = Lease.objects.create(order=order, buyer=buyer, slice=sl, mode=mode, price_per_hour=price_per_hour,
                                 bid_per_hour=bid, ends_at=ends_at, reservation=reservation,
                                 metered=mode in (Mode.ON_DEMAND, Mode.SPOT))
    if sl.state == Slice.State.READY:  # a whole non-MIG GPU needs nothing carved
        _run(lease, at=sl.ready_at or now)
    tell_buyer(buyer.pk, _event(lease, "lease_opened"))
    return lease


def _run(lease: Lease, *, at: datetime) -> None:
    lease.state, lease.started_at, lease.billed_until = Lease.State.RUNNING, at, billing_start(at)
    lease.ends_at = running_ends_at(lease=lease, at=at)
    lease.save(update_fields=["state", "started_at", "billed_until", "ends_at"])
    if lease.mode == Mode.SPOT:
        SpotBid.objects.filter(order_id=lease.order_id).update(state=SpotBid.State.WON)
    tell_buyer(lease.buyer_id, _event(lease, "lease_running", connection=connection_facts(lease)))


def running_ends_at(*, lease: Lease, at: datetime) -> datetime | None:
    """When a lease that starts running at `at` ends: an order's duration counts from here (a buyer who paid
    for 2 h of compute gets 2 h of running, however long the carving took); a reservation's window and an
    interruption's deadline are fixed instants and stay. A later reserved window on the same memory slices
    still wins: the lease then ends when that window starts (only possible when provisioning took longer
    than the allowance its holds were taken for, see capacity.provision_allowance)."""
    order = lease.order
    if lease.reservation_id is not None or order is None or not order.duration_seconds:
        return lease.ends_at
    ends = at + timedelta(seconds=order.duration_seconds)
    sl = lease.slice
    start, end = (sl.start, sl.start + sl.size) if sl.size else (0, 64)
    first = (capacity.overlapping_reservations(gpu_id=sl.gpu_id, slot_start=start, slot_end=end, start=at, end=ends)
             .order_by("starts_at").values_list("starts_at", flat=True).first())
    return min(ends, first) if first is not None and first > at else ends


def on_slice_ready(*, sl: Slice, at: datetime) -> None:
    """slice_ready: the agent made the instance (with its MIG UUID); the lease runs and billing starts."""
    # Lock the lease: the race is the buyer ending it while the agent's result arrives.
    lease = Lease.objects.select_for_update().filter(slice=sl, state=Lease.State.PROVISIONING).first()
    if lease is not None:
        lease.slice = sl
        _run(lease, at=at)


def on_slice_failed(*, sl: Slice, at: datetime, reason: str) -> None:
    """slice_failed: the capacity is free again; the lease failed, anything charged for it is refunded and a
    queue-or-fail order goes back to the queue."""
    # Lock the lease: the race is the buyer ending it while the agent's failure arrives.
    lease = Lease.objects.select_for_update().filter(slice=sl, state__in=Lease.OPEN_STATES).first()
    if lease is None:
        return
    # A GPU of a k-GPU order already ended because a sibling failed: the order was dealt with then.
    sibling_ended = lease.end_reason == SIBLING_FAILED
    lease.state, lease.ended_at, lease.end_reason = Lease.State.FAILED, at, "provisioning failed"
    lease.save(update_fields=["state", "ended_at", "end_reason"])
    if lease.reservation_id is not None:
        from .reservations import reservation_lost

        reservation_lost(reservation_id=lease.reservation_id)
    _refund_usage(lease.pk, memo=f"provisioning failed: {reason}")
    if lease.order_id and lease.mode in (Mode.ON_DEMAND, Mode.SPOT) and not sibling_ended:
        _end_siblings(lease, at=at, reason=reason)
        # Lock the order: the race is the buyer cancelling it while it goes back to the queue.
        order = Order.objects.select_for_update().get(pk=lease.order_id)
        requeue = order.if_unavailable == Order.IfUnavailable.QUEUE
        order.state = Order.State.QUEUED if requeue else Order.State.FAILED
        order.explain = f"provisioning failed: {reason}"[:500]
        order.save(update_fields=["state", "explain"])
    event = _event(lease, "lease_failed", reason=reason)
    tell_buyer(lease.buyer_id, event)
    notify_webhook(user_id=lease.buyer_id, kind="lease_failed", payload=event, order_webhook=_order_webhook(lease))


def _refund_usage(lease_id, *, memo: str) -> None:
    for txn in LedgerTransaction.objects.filter(lease_id=lease_id, kind="usage"):
        if ledger.refundable(original=txn)[1] > 0:  # what an operator refunded already is not given twice
            ledger.refund(original=txn, idempotency_key=f"refund:{txn.pk}", memo=memo[:400])


def _end_siblings(lease: Lease, *, at: datetime, reason: str) -> None:
    """A k-GPU order is all or nothing: when one of its GPUs fails to provision, the others end and whatever
    they were charged is refunded (the buyer asked for the k GPUs together)."""
    siblings = (Lease.objects.filter(order_id=lease.order_id, state__in=Lease.OPEN_STATES)
                .exclude(pk=lease.pk).order_by("pk").values_list("id", flat=True))
    for sibling_id in list(siblings):
        sibling = _locked(sibling_id)
        if sibling.state in (Lease.State.RUNNING, Lease.State.PROVISIONING, Lease.State.INTERRUPTING):
            _stop(sibling, reason=SIBLING_FAILED, at=at)
        _refund_usage(sibling.pk, memo=f"another GPU of the order failed to provision: {reason}")


def on_slice_destroyed(*, sl: Slice, at: datetime) -> None:
    # Lock the lease: the race is a second destroy confirmation or the beat ending it at the same time.
    lease = Lease.objects.select_for_update().filter(slice=sl, state__in=Lease.OPEN_STATES).first()
    if lease is None:
        return
    lease.state = Lease.State.ENDED
    lease.ended_at = lease.ended_at or at
    lease.end_reason = lease.end_reason or "instance destroyed"
    lease.save(update_fields=["state", "ended_at", "end_reason"])
    event = _event(lease, "lease_ended", reason=lease.end_reason)
    tell_buyer(lease.buyer_id, event)
    notify_webhook(user_id=lease.buyer_id, kind="lease_ended", payload=event, order_webhook=_order_webhook(lease))


def _order_webhook(lease: Lease) -> str:
    """The order's own webhook URL (it wins over the account's for that order's leases)."""
    if lease.order_id is None:
        return ""
    return Order.objects.filter(pk=lease.order_id).values_list("webhook_url", flat=True).first() or ""


def _stop(lease: Lease, *, reason: str, at: datetime) -> None:
    """Settle the meter, mark the lease ending and destroy its instance (lease locked by the caller)."""
    if lease.state == Lease.State.RUNNING:
        meter_settle(lease=lease, now=at)
    lease.state = Lease.State.ENDING
    lease.ended_at = lease.ended_at or at
    lease.end_reason = lease.end_reason or reason
    lease.save(update_fields=["state", "ended_at", "end_reason"])
    if lease.mode == Mode.SPOT:
        SpotBid.objects.filter(order_id=lease.order_id, state__in=[SpotBid.State.OPEN, SpotBid.State.WON]).update(
            state=SpotBid.State.CLOSED)
    slice_destroy(slice_id=lease.slice_id)  # may end the lease at once (nothing carved yet)
    tell_buyer(lease.buyer_id, _event(lease, "lease_ending", reason=lease.end_reason))


def _locked(lease_id, buyer=None) -> Lease:
    qs = Lease.objects.select_for_update(of=("self",)).select_related(
        "slice__gpu__node__provider", "slice__gpu__gpu_model", "buyer")
    if buyer is not None:
        qs = qs.filter(buyer=buyer)
    lease = qs.filter(pk=lease_id).first()
    if lease is None:
        raise NotFound("no such lease among yours", field="lease")
    return lease


def lease_end(*, lease_id, reason: str = "ended by the buyer", buyer=None, at: datetime | None = None) -> Lease:
    """End a lease: billing stops now, the instance is destroyed. Idempotent; `buyer` limits it to theirs."""
    at = at or timezone.now()
    with transaction.atomic():
        # Lock the lease: the race is the meter billing it, or the agent's result arriving, meanwhile.
        lease = _locked(lease_id, buyer)
        if lease.state in (Lease.State.RUNNING, Lease.State.PROVISIONING, Lease.State.INTERRUPTING):
            _stop(lease, reason=reason, at=at)
    return Lease.objects.select_related("slice__gpu__node").get(pk=lease_id)


def leases_node_offline(*, node_id, at: datetime) -> None:
    """node_offline: the node's open leases end at `at` (spot ones count as interrupted without notice; a
    reserved window goes back to booked, to be re-placed for the rest of its span)."""
    from .spot import spot_interrupt

    for lease_id, mode in Lease.objects.filter(slice__gpu__node_id=node_id, state__in=Lease.OPEN_STATES).values_list(
            "id", "mode"):
        if mode == Mode.SPOT:
            spot_interrupt(lease_id=lease_id, kind="node_offline", deadline=at, now=at)
        lease = lease_end(lease_id=lease_id, reason="node offline", at=at)
        if lease.reservation_id is not None and lease.end_reason == "node offline":
            from .reservations import reservation_lost

            reservation_lost(reservation_id=lease.reservation_id)


def leases_tick(*, now: datetime | None = None) -> int:
    """Beat: finish interruptions whose notice ran out, end leases past their duration or window, and move
    reservations along (start, clear spot in their way, end). Returns how many leases were stopped."""
    from .reservations import reservations_tick

    now = now or timezone.now()
    due = list(Lease.objects.filter(state__in=[Lease.State.RUNNING, Lease.State.INTERRUPTING,
                                               Lease.State.PROVISIONING], ends_at__lte=now)
               .values_list("id", "state"))
    for lease_id, state in due:
        with transaction.atomic():
            lease = _locked(lease_id)
            if lease.state == Lease.State.INTERRUPTING:
                _stop(lease, reason="interrupted", at=lease.ends_at)
            elif lease.state in (Lease.State.RUNNING, Lease.State.PROVISIONING):
                _stop(lease, reason="duration over" if lease.reservation_id is None else "window over",
                      at=min(now, lease.ends_at))
    reservations_tick(now=now)
    return len(due)
