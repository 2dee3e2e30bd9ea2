"""The lease lifecycle: every state of a lease and every transition, here and nowhere else.

    open ──► provisioning ──slice ready──► running ──interrupt (spot)──► interrupting ─┐
                  │   (with a workload: ──container running──►)  │                   │ deadline
                  │                          │  └─end (buyer, duration, window, money, node, the container's exit)
                  │                          │                                       ▼
                  └─slice failed / workload failed─► failed      └─────────────────► ending ──► ended
                                                                   (container removed, then the instance destroyed)

Each transition is one function and one transaction (the outermost one when a buyer, a tick or the API
calls it; inside the fleet's when a fleet fact arrives through the port, so the lease moves in the same
commit as its slice), and announces itself on commit (events.py). Billing starts at running — for a lease with
a workload, when its container runs — and stops at ending or interrupting (metering settles the rest then; a
job's lease at the exit the engine reported). The container is removed, then the instance destroyed, and that
ends the lease. A lease lost by the platform (provisioning failed, node offline) refunds what it was charged
(failed) or gives its reserved window back to be placed again (products/reservations.py); a workload that fails
to start (a bad image, a failed pull, a container that dies at start) fails its lease with the engine's reason
and refunds it. The workload's own states and the commands to the agent are in workloads.py.
"""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from marketplace import events, metering
from marketplace.lifecycle import budgets, workloads
from marketplace.amounts import cost
from marketplace.claims.holds import overlapping_reservations
from marketplace.conf import market
from marketplace.models import (Interruption, LedgerTransaction, Lease, Mode, Order, Reservation, SpotBid,
                                WorkloadRun)
from marketplace.money import movements
from scheduler.errors import Conflict, NotFound
from scheduler.models import Node, Slice
from scheduler.services.commands import command_issue
from scheduler.services.slices import slice_destroy

SIBLING_FAILED = "another GPU of the order failed"
# Why a reserved window's lease can be lost through no fault of its holder: the window is placed again for
# the rest of its span and the time it was not delivered is refunded pro rata.
LOST_REASONS = ("node offline", "provisioning failed", "instance lost on the node")
RUNNING_STATES = (Lease.State.RUNNING, Lease.State.PROVISIONING, Lease.State.INTERRUPTING)


def connection_facts(lease: Lease) -> dict | None:
    """What the buyer needs once it runs: the node, the device UUID and CUDA_VISIBLE_DEVICES, and for a lease
    with a container how to reach it (`ssh`, `urls`, `ports`, the Jupyter token: workloads.connection)."""
    sl = lease.slice
    if lease.state not in (Lease.State.RUNNING, Lease.State.INTERRUPTING):
        return None
    node = sl.gpu.node
    facts = {"node": str(node.pk), "hostname": node.hostname, "region": node.region, "gpu_uuid": sl.gpu.uuid,
             "device_uuid": sl.cuda_visible_devices, "mig_profile": sl.profile or None,
             "env": {"CUDA_VISIBLE_DEVICES": sl.cuda_visible_devices}}
    reach = workloads.connection(lease)
    if reach is not None:
        facts.update(reach)
    return facts


def _event(lease: Lease, kind: str, **extra) -> dict:
    return {"type": kind, "lease": str(lease.pk), "state": lease.state, "mode": lease.mode, **extra}


def _order_webhook(lease: Lease) -> str:
    """The order's own webhook URL (it wins over the account's for that order's leases)."""
    if lease.order_id is None:
        return ""
    return Order.objects.filter(pk=lease.order_id).values_list("webhook_url", flat=True).first() or ""


def _locked(lease_id, buyer=None, *, missing_ok: bool = False) -> Lease | None:
    qs = Lease.objects.select_for_update(of=("self",)).select_related(*metering.LOCKED, "buyer")
    if buyer is not None:
        qs = qs.filter(buyer=buyer)
    lease = qs.filter(pk=lease_id).first()
    if lease is None and not missing_ok:
        raise NotFound("no such lease among yours", field="lease")
    return lease


# --- open and run --------------------------------------------------------------------------------------------

def lease_open(*, order: Order | None, buyer, sl: Slice, mode: str, price_per_hour: Decimal,
               ends_at: datetime | None, reservation: Reservation | None = None, bid: Decimal | None = None,
               now: datetime) -> Lease:
    """A lease on a just-claimed slice (inside the transaction that claimed it): provisioning until the agent
    has made the instance, or running at once on a whole GPU that needs nothing carved."""
    with transaction.atomic():
        lease = Lease.objects.create(order=order, buyer=buyer, slice=sl, mode=mode, price_per_hour=price_per_hour,
                                     bid_per_hour=bid, ends_at=ends_at, reservation=reservation,
                                     metered=mode in (Mode.ON_DEMAND, Mode.SPOT))
        if reservation is not None:
            Reservation.objects.filter(pk=reservation.pk).update(state=Reservation.State.ACTIVE)
        events.tell_buyer(buyer.pk, _event(lease, "lease_opened"))
        if sl.state == Slice.State.READY:
            _ready(lease, at=sl.ready_at or now)
    return lease


def _ready(lease: Lease, *, at: datetime) -> None:
    """Its slice is there: a lease without a workload runs now; one with a workload starts its container and runs
    when the agent reports it running (a node whose port range is full fails it)."""
    if workloads.workload_of(lease) is None:
        _run(lease, at=at)
        return
    try:
        with transaction.atomic():
            workloads.start(lease)
    except Conflict as exc:
        _fail(lease, at=at, reason=exc.message, destroy_slice=True, requeue=False)


def _run(lease: Lease, *, at: datetime) -> None:
    lease.state, lease.started_at = Lease.State.RUNNING, at
    metering.start(lease, at)
    lease.ends_at = running_ends_at(lease=lease, at=at)
    lease.save(update_fields=["state", "started_at", "accrued_until", "billed_until", "ends_at"])
    if lease.mode == Mode.SPOT:
        SpotBid.objects.filter(order_id=lease.order_id).update(state=SpotBid.State.WON)
    events.tell_buyer(lease.buyer_id, _event(lease, "lease_running", connection=connection_facts(lease)))


def running_ends_at(*, lease: Lease, at: datetime) -> datetime | None:
    """When a lease that starts running at `at` ends: an order's duration counts from here (a buyer who paid
    for 2 h of compute gets 2 h of running, however long the carving took); a reservation's window and an
    interruption's deadline are fixed instants and stay. A later reserved window on the same memory slices
    still wins: the lease then ends when that window starts (only possible when provisioning took longer
    than the allowance its holds were taken for, claims.holds.provision_allowance)."""
    order = lease.order
    if lease.reservation_id is not None or order is None or not order.duration_seconds:
        return lease.ends_at
    ends = at + timedelta(seconds=order.duration_seconds)
    sl = lease.slice
    first = (overlapping_reservations(gpu_id=sl.gpu_id, slots=sl.slots, start=at, end=ends)
             .order_by("starts_at").values_list("starts_at", flat=True).first())
    return min(ends, first) if first is not None and first > at else ends


def slice_ready(*, sl: Slice, at: datetime) -> None:
    """The agent made the instance (with its MIG UUID): the lease runs and billing starts."""
    with transaction.atomic():
        # Lock the lease: the race is the buyer ending it while the agent's result arrives.
        lease = Lease.objects.select_for_update().filter(slice=sl, state=Lease.State.PROVISIONING).first()
        if lease is not None:
            lease.slice = sl
            _ready(lease, at=at)


# --- failing ---------------------------------------------------------------------------------------------------

def slice_failed(*, sl: Slice, at: datetime, reason: str) -> None:
    """The slice failed. While carving (the lease provisioning): the capacity is free again; the lease failed,
    anything charged for it is refunded, a k-GPU order's other GPUs end too, and a queue-or-fail order goes back
    to the queue or fails. Under a running lease (its instance vanished from the node, found when the agent
    reconnected): the platform lost it; billed up to now, its container stopped, ended, and a reserved window
    placed again for the rest of its span. Under an ending lease: nothing is left to destroy; it has ended."""
    with transaction.atomic():
        # Lock the lease: the race is the buyer ending it while the agent's failure arrives.
        lease = Lease.objects.select_for_update().filter(slice=sl, state__in=Lease.OPEN_STATES).first()
        if lease is None:
            return
        if lease.state == Lease.State.PROVISIONING:
            _fail(lease, at=at, reason=reason, destroy_slice=False, requeue=True)
        elif lease.state in (Lease.State.RUNNING, Lease.State.INTERRUPTING):
            _stop(lease, reason="instance lost on the node", at=at)
            _window_lost(lease)
        else:
            _ended(lease, at=at)


def _fail(lease: Lease, *, at: datetime, reason: str, destroy_slice: bool, requeue: bool) -> None:
    """The lease failed to start (locked by the caller): refunded, its window given back, its k-GPU siblings
    ended, its order re-queued (a queue order whose carving failed: another slice may do) or failed (a workload
    that cannot start would fail again), announced with the reason; the slice destroyed if it was carved."""
    sibling_ended = lease.end_reason == SIBLING_FAILED  # the order was dealt with when its sibling failed
    lease.state, lease.ended_at = Lease.State.FAILED, at
    lease.end_reason = "provisioning failed" if not destroy_slice else "workload failed"
    lease.save(update_fields=["state", "ended_at", "end_reason"])
    if not destroy_slice:
        # The platform's failure: a reserved window is placed again. (A workload that cannot start is not: it
        # would fail again; the window's unused time is refunded when it ends.)
        _window_lost(lease)
    _refund_usage(lease.pk, memo=f"provisioning failed: {reason}")
    workloads.stop(lease, grace_seconds=0)  # a container still being pulled or started there goes too
    if destroy_slice:
        slice_destroy(slice_id=lease.slice_id)
    if lease.order_id and lease.mode in (Mode.ON_DEMAND, Mode.SPOT) and not sibling_ended:
        _end_siblings(lease, at=at, reason=reason)
        # Lock the order: the race is the buyer cancelling it while it goes back to the queue.
        order = Order.objects.select_for_update().get(pk=lease.order_id)
        again = requeue and order.if_unavailable == Order.IfUnavailable.QUEUE
        order.state = Order.State.QUEUED if again else Order.State.FAILED
        order.explain = f"provisioning failed: {reason}"[:500]
        order.save(update_fields=["state", "explain"])
    event = _event(lease, "lease_failed", reason=reason)
    events.tell_buyer(lease.buyer_id, event)
    events.notify_webhook(user_id=lease.buyer_id, kind="lease_failed", payload=event,
                          order_webhook=_order_webhook(lease))


def _window_lost(lease: Lease) -> None:
    """A reserved window's lease was lost mid-window: the window goes back to booked, so the beat places it
    again for the rest of its span (products/reservations.py)."""
    if lease.reservation_id is not None:
        Reservation.objects.filter(pk=lease.reservation_id, state=Reservation.State.ACTIVE).update(
            state=Reservation.State.BOOKED)


def _refund_usage(lease_id, *, memo: str) -> None:
    for txn in LedgerTransaction.objects.filter(lease_id=lease_id, kind="usage"):
        if movements.refundable(original=txn)[1] > 0:  # what an operator refunded already is not given twice
            movements.refund(original=txn, idempotency_key=f"refund:{txn.pk}", memo=memo[:400])


def _end_siblings(lease: Lease, *, at: datetime, reason: str) -> None:
    """A k-GPU order is all or nothing: when one of its GPUs fails to provision, the others end and whatever
    they were charged is refunded (the buyer asked for the k GPUs together)."""
    siblings = (Lease.objects.filter(order_id=lease.order_id, state__in=Lease.OPEN_STATES)
                .exclude(pk=lease.pk).order_by("pk").values_list("id", flat=True))
    for sibling_id in list(siblings):
        sibling = _locked(sibling_id)
        if sibling.state in RUNNING_STATES:
            _stop(sibling, reason=SIBLING_FAILED, at=at)
        _refund_usage(sibling.pk, memo=f"another GPU of the order failed to provision: {reason}")


# --- ending ----------------------------------------------------------------------------------------------------

def _stop(lease: Lease, *, reason: str, at: datetime, grace_seconds: float | None = None) -> None:
    """Settle the meter, mark the lease ending, stop its container and destroy its instance (lease locked by the
    caller). `grace_seconds`: between SIGTERM and the kill (default WORKLOAD_STOP_GRACE_SECONDS)."""
    if lease.state == Lease.State.RUNNING:
        metering.settle(lease, now=at)
    lease.state = Lease.State.ENDING
    lease.ended_at = lease.ended_at or at
    lease.end_reason = lease.end_reason or reason
    lease.save(update_fields=["state", "ended_at", "end_reason"])
    if lease.mode == Mode.SPOT:
        SpotBid.objects.filter(order_id=lease.order_id, state__in=[SpotBid.State.OPEN, SpotBid.State.WON]).update(
            state=SpotBid.State.CLOSED)
    events.tell_buyer(lease.buyer_id, _event(lease, "lease_ending", reason=lease.end_reason))
    # Its container goes first (the agent reports it removed, and the slice is destroyed then); a lease without
    # one destroys its slice now, which may end the lease at once (nothing carved yet).
    if not workloads.stop(lease, grace_seconds=grace_seconds):
        _destroy_slice(lease, at=at)


def _destroy_slice(lease: Lease, *, at: datetime) -> None:
    """Destroy the ending lease's slice; the agent's confirmation ends the lease (slice_destroyed). A slice with
    nothing carved, or gone already (failed, destroyed), is confirmed by nobody: the lease ends now."""
    sl = slice_destroy(slice_id=lease.slice_id)
    if sl.state in (Slice.State.DESTROYED, Slice.State.FAILED):
        slice_destroyed(sl=sl, at=sl.ended_at or at)


def lease_end(*, lease_id, reason: str = "ended by the buyer", buyer=None, at: datetime | None = None) -> Lease:
    """End a lease: billing stops now, the instance is destroyed. Idempotent; `buyer` limits it to theirs."""
    at = at or timezone.now()
    with transaction.atomic():
        # Lock the lease: the race is the meter billing it, or the agent's result arriving, meanwhile.
        lease = _locked(lease_id, buyer)
        if lease.state in RUNNING_STATES:
            _stop(lease, reason=reason, at=at)
    return Lease.objects.select_related("slice__gpu__node").get(pk=lease_id)


def slice_destroyed(*, sl: Slice, at: datetime) -> None:
    """The instance is gone: an ending lease has ended (one whose instance vanished under it too)."""
    with transaction.atomic():
        # Lock the lease: the race is a second destroy confirmation or the beat ending it at the same time.
        lease = Lease.objects.select_for_update().filter(slice=sl, state__in=Lease.OPEN_STATES).first()
        if lease is not None:
            _ended(lease, at=at)


def _ended(lease: Lease, *, at: datetime) -> None:
    """The lease's slice is gone: it has ended (locked by the caller)."""
    if lease.state == Lease.State.RUNNING:
        metering.settle(lease, now=at)  # gone under it: billed up to now, then over
    lease.state = Lease.State.ENDED
    lease.ended_at = lease.ended_at or at
    lease.end_reason = lease.end_reason or "instance destroyed"
    lease.save(update_fields=["state", "ended_at", "end_reason"])
    event = _event(lease, "lease_ended", reason=lease.end_reason)
    events.tell_buyer(lease.buyer_id, event)
    events.notify_webhook(user_id=lease.buyer_id, kind="lease_ended", payload=event,
                          order_webhook=_order_webhook(lease))


def node_offline(*, node_id, at: datetime) -> None:
    """The node has been silent since `at` (its last heartbeat) for longer than the offline grace: its open leases
    were lost at `at`. Each ends as lost then, and whatever the meter charged for the silent time after it is
    refunded (the buyer never pays for a second the node may not have run); spot ones count as interrupted without
    notice, so credited; a reserved window goes back to booked, to be placed again for the rest of its span."""
    for lease_id, mode in list(Lease.objects.filter(slice__gpu__node_id=node_id, state__in=Lease.OPEN_STATES)
                               .values_list("id", "mode")):
        with transaction.atomic():
            if mode == Mode.SPOT:
                lease_interrupt(lease_id=lease_id, kind=Interruption.Kind.NODE_OFFLINE, deadline=at, now=at)
            lease = lease_end(lease_id=lease_id, reason="node offline", at=at)
            if lease.end_reason == "node offline":
                metering.unbill_after(_locked(lease_id), at=at, memo="the node fell silent: no charge after its "
                                                                    "last heartbeat")
                _window_lost(lease)


# --- spot ------------------------------------------------------------------------------------------------------

def lease_interrupt(*, lease_id, kind: str, now: datetime | None = None,
                    deadline: datetime | None = None) -> Interruption | None:
    """Interrupt a spot lease with a notice ending at `deadline` (default: the full notice from now): billing
    stops now, the buyer hears over the socket, the webhook and the agent; a notice shorter than promised is
    credited (SHORT_NOTICE_CREDIT_HOURS of its price). The lease is stopped when the deadline passes."""
    now = now or timezone.now()
    required = market("SPOT_NOTICE_SECONDS")
    deadline = deadline or now + timedelta(seconds=required)
    with transaction.atomic():
        # Lock the lease: the race is two interrupters (price tick, preemption, reservation) or the meter.
        lease = _locked(lease_id, missing_ok=True)
        if lease is None or lease.mode != Mode.SPOT or lease.state not in (Lease.State.RUNNING,
                                                                          Lease.State.PROVISIONING):
            return None
        given = max(0.0, (deadline - now).total_seconds())
        was_running = lease.state == Lease.State.RUNNING
        if was_running:
            metering.settle(lease, now=now)  # billing stops at the interruption
        lease.state, lease.ends_at = Lease.State.INTERRUPTING, deadline
        lease.save(update_fields=["state", "ends_at"])
        sl, gpu = lease.slice, lease.slice.gpu
        intr = Interruption.objects.create(
            lease=lease, kind=kind, announced_at=now, deadline=deadline, notice_seconds=given,
            required_notice_seconds=required, gpu_model=gpu.gpu_model.key if gpu.gpu_model else "",
            profile=sl.profile or "whole", region=gpu.node.region)
        if was_running and given + 1e-6 < required:
            amount = cost(per_hour=lease.price_per_hour, seconds=market("SHORT_NOTICE_CREDIT_HOURS") * 3600)
            if amount > 0:
                movements.credit(user=lease.buyer_id, amount=amount, idempotency_key=f"notice-credit:{lease.pk}",
                                 memo=f"short spot notice ({given:.0f}s of {required:.0f}s) on lease "
                                      f"{str(lease.pk)[:8]}", lease=lease.pk, order=lease.order_id)
                intr.credited = amount
                intr.save(update_fields=["credited"])
        SpotBid.objects.filter(order_id=lease.order_id).update(state=SpotBid.State.OUTBID)
        payload = {"type": "interruption", "lease": str(lease.pk), "kind": kind, "deadline": deadline.isoformat(),
                   "notice_seconds": round(given, 3), "instance_uuid": sl.instance_uuid or gpu.uuid,
                   "credited": str(intr.credited)}
        events.tell_buyer(lease.buyer_id, payload)
        events.notify_webhook(user_id=lease.buyer_id, kind="interruption", payload=payload,
                              order_webhook=lease.order.webhook_url if lease.order_id else "")
        if gpu.node.status == Node.Status.ONLINE:
            workload = workloads.workload_of(lease)
            command_issue(node=gpu.node, op="notice", args={
                "kind": f"spot_interruption:{kind}", "deadline": deadline.isoformat(),
                "instance_uuid": sl.instance_uuid or gpu.uuid, "lease": str(lease.pk),
                "mode": workload.notice if workload is not None else "sigterm"})
    return intr


def lease_reprice(*, lease_id, price: Decimal, now: datetime) -> None:
    """A running spot lease's price changes: the seconds before are billed at the old price, exactly once."""
    with transaction.atomic():
        # Lock the lease: the race is the meter posting it while its price changes.
        lease = _locked(lease_id, missing_ok=True)
        if lease is None or lease.state not in (Lease.State.RUNNING, Lease.State.PROVISIONING):
            return
        if lease.state == Lease.State.RUNNING:
            metering.accrue(lease, now)
        lease.price_per_hour = price
        lease.save(update_fields=["price_per_hour", "accrued_until", "cost_accrued"])


# --- ticks -------------------------------------------------------------------------------------------------------

def leases_tick(*, now: datetime | None = None) -> int:
    """Beat: finish interruptions whose notice ran out, end leases past their duration or window. Returns how
    many leases were stopped."""
    now = now or timezone.now()
    due = list(Lease.objects.filter(state__in=RUNNING_STATES, ends_at__lte=now).values_list("id", flat=True))
    for lease_id in due:
        with transaction.atomic():
            lease = _locked(lease_id)
            if lease.state == Lease.State.INTERRUPTING:
                _stop(lease, reason="interrupted", at=lease.ends_at, grace_seconds=0)  # the notice was its grace
            elif lease.state in (Lease.State.RUNNING, Lease.State.PROVISIONING) and lease.ends_at <= now:
                _stop(lease, reason="duration over" if lease.reservation_id is None else "window over",
                      at=min(now, lease.ends_at))
    return len(due)


def meter_tick(*, now: datetime | None = None) -> int:
    """Beat: metering's tick (metering.meter_tick), then end the leases whose buyers' money ran out and warn
    those running low. Returns the number of leases posted."""
    now = now or timezone.now()
    result = metering.meter_tick(now=now)
    for lease_id in dict.fromkeys(result.stop):
        lease_end(lease_id=lease_id, reason="insufficient_funds", at=now)
    # Hard-capped projects: a notice BUDGET_NOTICE_SECONDS before the cap, then their pay-as-you-go leases end.
    for reached in budgets.caps_reached(now=now):
        with transaction.atomic():
            budgets.cap_notice(reached, now=now)
        for lease_id in reached.leases:
            lease_end(lease_id=lease_id, reason="budget_cap", at=now)
    for w in result.warnings:
        with transaction.atomic():
            Lease.objects.filter(pk__in=w.leases).update(warned_at=now)
            event = {"type": "balance_low", "balance": str(w.balance), "burn_per_hour": str(w.burn_per_hour),
                     "seconds_left": int(w.seconds_left),
                     "stops_in": int(w.seconds_left - market("BALANCE_STOP_SECONDS"))}
            events.tell_buyer(w.buyer_id, event)
            events.notify_webhook(user_id=w.buyer_id, kind="balance_low", payload=event)
    return result.posted


# --- workloads: what the agent reports of a lease's container ----------------------------------------------------

def _locked_on(node_id, lease_id) -> Lease | None:
    """The lease, locked, if it runs on `node_id` (an agent speaks only for its own node's leases)."""
    return (Lease.objects.select_for_update(of=("self",)).select_related(*metering.LOCKED, "buyer")
            .filter(pk=_uuid_or_none(lease_id), slice__gpu__node_id=node_id).first())


def _uuid_or_none(value):
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def _cleanup(node_id, lease_id: str) -> None:
    """A container of a lease that is over (or unknown here): the agent removes it."""
    node = Node.objects.filter(pk=node_id).first()
    if node is not None:
        command_issue(node=node, op="stop_workload", args={"lease": str(lease_id), "grace_seconds": 0})


def workload_state(*, node_id, frame: dict) -> None:
    """A container's state changed (protocol `workload` frame): the run records it and the lease follows —
    running starts billing, an exit ends the lease (a job's at its exit), a failure at start fails it with the
    engine's reason, a removal lets its slice be destroyed."""
    with transaction.atomic():
        lease = _locked_on(node_id, frame["lease"])
        run = WorkloadRun.objects.select_for_update().filter(lease=lease).first() if lease is not None else None
        if run is None:
            if frame["state"] in ("running", "exited"):
                _cleanup(node_id, frame["lease"])
            return
        workloads.record(run, frame)
        state, at = frame["state"], workloads.at_of(frame.get("at")) or timezone.now()
        if state == "running" and lease.state == Lease.State.PROVISIONING:
            _run(lease, at=run.started_at or at)
        elif state == "exited" and lease.state in (Lease.State.RUNNING, Lease.State.INTERRUPTING):
            workload = workloads.workload_of(lease)
            what = "job finished" if workload is not None and workload.kind == "job" else "container exited"
            code = f" with code {run.exit_code}" if run.exit_code is not None else ""
            _stop(lease, reason=f"{what}{code}", at=run.finished_at or at)
        elif state in ("exited", "failed") and lease.state == Lease.State.PROVISIONING:
            why = run.error or f"the container exited at start with code {run.exit_code}"
            _fail(lease, at=at, reason=f"the workload did not start: {why}", destroy_slice=True, requeue=False)
        elif state == "failed" and lease.state in (Lease.State.RUNNING, Lease.State.INTERRUPTING):
            _stop(lease, reason="container failed", at=at)
        elif state == "removed" and lease.state == Lease.State.ENDING:
            _destroy_slice(lease, at=at)
        elif state == "removed" and lease.state in (Lease.State.RUNNING, Lease.State.INTERRUPTING):
            _stop(lease, reason="container removed on the node", at=at)
        workloads.announce(run, lease)


def workload_output(*, node_id, frame: dict) -> None:
    """A chunk of a container's output: kept (the last WORKLOAD_LOG_TAIL_BYTES) and shown live to its buyer."""
    lease = Lease.objects.filter(pk=_uuid_or_none(frame["lease"]), slice__gpu__node_id=node_id).only(
        "pk", "buyer_id").first()
    run = WorkloadRun.objects.filter(lease=lease).first() if lease is not None else None
    if run is None:
        return
    workloads.append_output(run, frame["data"])
    events.tell_lease_watchers(lease.pk, {"type": "lease_log", "lease": str(lease.pk), "data": frame["data"]})


def workloads_found(*, node_id, found: list[dict]) -> None:
    """The agent (re)started and found these containers ({lease, container, state}): those of open leases are
    adopted, the others removed; an open lease whose container is not among them lost it (it ends, or, still
    starting, its container is asked for again)."""
    seen = {f["lease"]: f for f in found}
    with transaction.atomic():
        for lease_id, f in seen.items():
            lease = _locked_on(node_id, lease_id)
            run = WorkloadRun.objects.select_for_update().filter(lease=lease).first() if lease is not None else None
            if run is None or lease.state not in Lease.OPEN_STATES:
                _cleanup(node_id, lease_id)
                continue
            if f["state"] == "running":
                workload_state(node_id=node_id, frame={"lease": lease_id, "state": "running",
                                                       "container": f["container"], "at": None})
            else:
                workload_state(node_id=node_id, frame={"lease": lease_id, "state": "exited",
                                                       "container": f["container"], "at": None})
        lost = (Lease.objects.filter(slice__gpu__node_id=node_id, state__in=Lease.OPEN_STATES,
                                     run__state__in=[WorkloadRun.State.PULLING, WorkloadRun.State.STARTING,
                                                     WorkloadRun.State.RUNNING, WorkloadRun.State.PENDING])
                .exclude(pk__in=[_uuid_or_none(x) for x in seen]).values_list("id", flat=True))
        for lease_id in list(lost):
            lease = _locked(lease_id)
            if lease.state == Lease.State.PROVISIONING:
                workloads.start(lease)  # the agent lost the start (it restarted mid-pull): ask again
            elif lease.state in (Lease.State.RUNNING, Lease.State.INTERRUPTING):
                WorkloadRun.objects.filter(lease=lease).update(state=WorkloadRun.State.REMOVED)
                _stop(lease, reason="container lost on the node", at=timezone.now())


def workload_command_finished(*, command) -> None:
    """A start_workload or stop_workload command was answered (or timed out). A start the agent refused (no
    runtime there, a spec it cannot run) fails its lease; a stop done, failed or timed out lets the slice go —
    an agent that comes back removes what it still runs of an ended lease when it says hello."""
    lease_id = (command.args or {}).get("lease")
    if command.op not in ("start_workload", "stop_workload") or not lease_id:
        return
    with transaction.atomic():
        lease = _locked_on(command.node_id, lease_id)
        if lease is None:
            return
        failed = command.state != command.State.SUCCEEDED
        if command.op == "start_workload" and failed and command.error_code != "timeout" \
                and lease.state == Lease.State.PROVISIONING:
            run = WorkloadRun.objects.select_for_update().filter(lease=lease).first()
            if run is not None:
                workloads.record(run, {"state": "failed", "reason": command.error_message, "at": None})
            _fail(lease, at=timezone.now(), reason=f"the workload did not start: {command.error_message}",
                  destroy_slice=True, requeue=False)
        elif command.op == "stop_workload" and lease.state == Lease.State.ENDING:
            _destroy_slice(lease, at=timezone.now())
