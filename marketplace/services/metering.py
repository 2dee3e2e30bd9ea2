"""Per-second billing of running leases through the ledger, and the balance guard that keeps wallets >= 0.

A lease is billed whole seconds from `billed_until` (its start, truncated to the second) to now. The exact
cost accrues in `cost_accrued` (8 places); the ledger is charged the part not yet charged, rounded to the
micro-dollar, so the sum of charges equals price × seconds however the ticks fall. Each charge has an
idempotency key per lease and period, and the seconds land in one UsageRecord per lease per minute.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from marketplace.models import Lease, UsageRecord
from marketplace.services import ledger

from .capacity import MICRO, market, micro
from .notify import notify_webhook, tell_buyer

log = logging.getLogger(__name__)
EIGHT = Decimal("0.00000001")


def billing_start(at: datetime) -> datetime:
    return at.replace(microsecond=0)


def meter_settle(*, lease: Lease, now: datetime) -> Decimal:
    """Charge `lease` (locked by the caller, slice/gpu/node loaded) up to `now`; returns what is still owed
    and could not be charged (non-zero only when the wallet ran dry: the caller stops the lease)."""
    if not lease.metered or lease.billed_until is None:
        return Decimal("0")
    if lease.ends_at is not None:
        # A lease's duration (or an interruption's deadline) ends its billing even if the beat that stops
        # it runs after the meter's: the seconds past ends_at are not the buyer's to pay.
        now = min(now, lease.ends_at)
    seconds = int((now - lease.billed_until).total_seconds())
    if seconds <= 0:
        return Decimal("0")
    start, end = lease.billed_until, lease.billed_until + timedelta(seconds=seconds)
    lease.cost_accrued = (lease.cost_accrued + lease.price_per_hour * seconds / Decimal(3600)).quantize(EIGHT)
    lease.billed_until = end
    due = micro(lease.cost_accrued) - lease.cost_charged
    owed = Decimal("0")
    if due > 0:
        charged = _charge(lease=lease, amount=due, start=start, end=end)
        lease.cost_charged += charged
        owed = due - charged
    lease.save(update_fields=["cost_accrued", "billed_until", "cost_charged"])
    return owed


def _charge(*, lease: Lease, amount: Decimal, start: datetime, end: datetime) -> Decimal:
    node = lease.slice.gpu.node
    available = ledger.wallet_balance(user=lease.buyer)
    amount = min(amount, available)
    if amount <= 0:
        return Decimal("0")
    key = f"usage:{lease.pk}:{int(start.timestamp())}-{int(end.timestamp())}"
    try:
        with transaction.atomic():
            txn = ledger.charge_usage(buyer=lease.buyer, provider=node.provider, amount=amount, lease=lease.pk,
                                      order=lease.order_id, project=_project_of(lease), idempotency_key=key,
                                      memo=f"{lease.mode} lease {str(lease.pk)[:8]} {start:%H:%M:%S}-{end:%H:%M:%S}")
    except ledger.InsufficientFunds:
        # Another charge spent the wallet since we read it: take what is left (the lease stops now).
        available = ledger.wallet_balance(user=lease.buyer)
        if available <= 0:
            return Decimal("0")
        return _charge(lease=lease, amount=min(amount, available), start=start, end=end)
    fee = ledger.fee_for(amount=amount, fee_rate=settings.PLATFORM_FEE_RATE)
    _usage(lease=lease, txn=txn, amount=amount, fee=fee, start=start, end=end)
    return amount


def _project_of(lease: Lease):
    """The project the lease's order was placed for (None without one): its charges are grouped there."""
    return lease.order.project if lease.order_id is not None else None


def _usage(*, lease: Lease, txn, amount: Decimal, fee: Decimal, start: datetime, end: datetime) -> None:
    """Spread one charge over the minutes it covers, one UsageRecord per lease per minute."""
    pieces = []
    t = start
    while t < end:
        minute = t.replace(second=0, microsecond=0)
        stop = min(end, minute + timedelta(minutes=1))
        pieces.append((minute, int((stop - t).total_seconds())))
        t = stop
    total = sum(s for _, s in pieces)
    gpu = lease.slice.gpu
    amounts = _spread(amount, [secs for _, secs in pieces], total)
    fees = _spread_fee(fee, amounts, [secs for _, secs in pieces], total)
    for (minute, secs), a, f in zip(pieces, amounts, fees):
        rec, created = UsageRecord.objects.get_or_create(
            lease_id=lease.pk, minute=minute,
            defaults=dict(order_id=lease.order_id, project=_project_of(lease), buyer=lease.buyer,
                          provider=gpu.node.provider,
                          node_id=gpu.node_id, gpu_model=gpu.gpu_model.key if gpu.gpu_model else "",
                          profile=lease.slice.profile or "whole", mode=lease.mode, seconds=secs, amount=a, fee=f,
                          transaction=txn))
        if not created:  # a minute shared by two ticks: the lease's row lock serialises these updates
            rec.seconds, rec.amount, rec.fee, rec.transaction = min(60, rec.seconds + secs), rec.amount + a, \
                rec.fee + f, txn
            rec.save(update_fields=["seconds", "amount", "fee", "transaction"])


def _spread(amount: Decimal, weights: list[int], total: int) -> list[Decimal]:
    """`amount` shared over `weights` in micro-dollars adding up to exactly it, none negative: each piece is
    the step between rounded-down cumulative shares (rounding each piece alone could give 60 pieces of a tiny
    charge more than the charge, and the last piece a negative amount)."""
    units, out, before, seen = int(amount / MICRO), [], 0, 0
    for w in weights:
        seen += w
        upto = units * seen // total
        out.append(Decimal(upto - before) * MICRO)
        before = upto
    return out


def _spread_fee(fee: Decimal, amounts: list[Decimal], weights: list[int], total: int) -> list[Decimal]:
    """The fee spread like its charge, never more than a piece's amount; what rounding leaves goes to the
    pieces with room, latest first (the fee never exceeds the charge, so there is room)."""
    fees = [min(f, a) for f, a in zip(_spread(fee, weights, total), amounts)]
    left = fee - sum(fees, Decimal("0"))
    for i in reversed(range(len(fees))):
        if left <= 0:
            break
        add = min(left, amounts[i] - fees[i])
        fees[i] += add
        left -= add
    return fees


def _locked_running(lease_id):
    # Lock the lease: the race is the meter against the buyer ending it or an interruption settling it,
    # which would otherwise bill the same seconds twice. skip_locked: whoever holds it is settling anyway.
    return (Lease.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("slice__gpu__node__provider", "slice__gpu__gpu_model", "buyer", "order__project")
            .filter(pk=lease_id, state=Lease.State.RUNNING, metered=True).first())


def meter_tick(*, now: datetime | None = None) -> int:
    """Bill every running metered lease up to now, then guard each buyer's balance. Returns leases billed."""
    from .leases import lease_end

    now = now or timezone.now()
    billed = 0
    buyers = set()
    for lease_id in list(Lease.objects.filter(state=Lease.State.RUNNING, metered=True).values_list("id", flat=True)):
        with transaction.atomic():
            lease = _locked_running(lease_id)
            if lease is None:
                continue
            owed = meter_settle(lease=lease, now=now)
            billed += 1
            buyers.add(lease.buyer_id)
        if owed > 0:
            lease_end(lease_id=lease_id, reason="insufficient_funds", at=now)
    for buyer_id in buyers:
        balance_guard(buyer_id=buyer_id, now=now)
    return billed


def balance_guard(*, buyer_id, now: datetime) -> str:
    """Warn a buyer whose wallet runs out soon; stop their metered leases before it would go negative."""
    from .leases import lease_end

    running = list(Lease.objects.filter(buyer_id=buyer_id, state=Lease.State.RUNNING, metered=True)
                   .values_list("id", "price_per_hour", "warned_at"))
    burn = sum((p for _, p, _ in running), Decimal("0"))
    if burn <= 0:
        return "ok"
    balance = _wallet_of(buyer_id)
    seconds_left = float(balance / burn * 3600)
    if seconds_left < market("BALANCE_STOP_SECONDS"):
        for lease_id, _, _ in running:
            lease_end(lease_id=lease_id, reason="insufficient_funds", at=now)
        log.info("stopped %d leases of buyer %s: balance %s", len(running), buyer_id, balance)
        return "stopped"
    if seconds_left < market("BALANCE_WARN_SECONDS"):
        recent = now - timedelta(seconds=market("BALANCE_WARN_SECONDS") / 3)
        if any(w is None or w < recent for _, _, w in running):
            with transaction.atomic():
                Lease.objects.filter(pk__in=[i for i, _, _ in running]).update(warned_at=now)
                event = {"type": "balance_low", "balance": str(balance), "burn_per_hour": str(burn),
                         "seconds_left": int(seconds_left),
                         "stops_in": int(seconds_left - market("BALANCE_STOP_SECONDS"))}
                tell_buyer(buyer_id, event)
                notify_webhook(user_id=buyer_id, kind="balance_low", payload=event)
        return "warned"
    return "ok"


def _wallet_of(buyer_id) -> Decimal:
    from django.contrib.auth import get_user_model

    return ledger.wallet_balance(user=get_user_model()(pk=buyer_id))
