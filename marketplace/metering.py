"""Per-second billing of running leases, posted to the ledger once a minute per lease.

A running metered lease costs its price per hour for every whole second from its start (truncated to the
second). Nothing is written while it runs: the exact cost of [start, accrued_until) is kept on the lease
(8 places), and every second after accrued_until costs the current price, so what a lease owes at any
instant is `cost_at(lease, now)` — the console shows it ticking without a write. `accrue` folds the seconds
so far into cost_accrued before the price changes (spot repricing).

`meter_tick` (beat, every METER_SECONDS) reads the running leases once and:
1. guards every buyer's wallet: at the current burn rate and with what the leases owe but the ledger has
   not charged yet, a buyer under BALANCE_WARN_SECONDS of money is warned, under BALANCE_STOP_SECONDS their
   leases are stopped (returned to the caller, the lifecycle, which ends them);
2. posts the leases whose last whole calendar minute is not charged yet, up to that minute, in batches
   spread over the ticks of a minute: one ledger transaction per lease per minute (never more than the
   wallet holds; a lease whose money ran out is returned to be ended) and one UsageRecord per lease-minute,
   in a constant number of statements per batch (ledger.post_many).
A lease's end or interruption posts the rest (`settle`). The sum of its charges is price × seconds to the
micro-dollar however the ticks and minutes fall (accrual keeps 8 places, each posting charges the
rounded total less what was charged before).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from marketplace.amounts import ZERO, micro, spread, spread_within
from marketplace.conf import market
from marketplace.models import Lease, UsageRecord
from marketplace.money import ledger, movements

EIGHT = Decimal("0.00000001")
POST_BATCH_MIN = 200  # leases posted per tick at least, when that many are due
LOCKED = ("slice__gpu__node", "slice__gpu__gpu_model", "order")


def billing_start(at: datetime) -> datetime:
    return at.replace(microsecond=0)


def minute_of(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def _until(lease: Lease, now: datetime) -> datetime:
    """Billing never passes the lease's end (its duration, window or interruption deadline), whichever beat
    runs first: the seconds after it are not the buyer's to pay."""
    return min(now, lease.ends_at) if lease.ends_at is not None else now


def _seconds(lease: Lease, now: datetime) -> int:
    if lease.accrued_until is None:
        return 0
    return max(0, int((_until(lease, now) - lease.accrued_until).total_seconds()))


def cost_at(lease: Lease, now: datetime) -> Decimal:
    """The exact cost of the lease from its start until `now` (8 places): what is accrued, and while it runs
    metered, the seconds since at its price."""
    if lease.state != Lease.State.RUNNING or not lease.metered:
        return lease.cost_accrued
    return lease.cost_accrued + lease.price_per_hour * _seconds(lease, now) / Decimal(3600)


def owed(lease: Lease, now: datetime) -> Decimal:
    """What the lease owes at `now` that the ledger has not charged (micro-dollars)."""
    if lease.accrued_until is None:
        return ZERO
    return max(ZERO, micro(cost_at(lease, now)) - lease.cost_charged)


def accrue(lease: Lease, now: datetime) -> None:
    """Fold the whole seconds since accrued_until, at the current price, into cost_accrued (not saved)."""
    seconds = _seconds(lease, now)
    if seconds:
        lease.cost_accrued = (lease.cost_accrued + lease.price_per_hour * seconds / Decimal(3600)).quantize(EIGHT)
        lease.accrued_until += timedelta(seconds=seconds)


def start(lease: Lease, at: datetime) -> None:
    """Billing starts at `at` (not saved)."""
    lease.accrued_until = lease.billed_until = billing_start(at)


@dataclass
class Posted:
    lease: Lease
    short: Decimal  # what it owed and its buyer's wallet could not pay (> 0: the money ran out)


def post(leases: list[Lease], *, now: datetime) -> list[Posted]:
    """Charge each lease (locked by the caller, with slice.gpu.node and order loaded) what it owes up to `now`
    and record its usage per minute; saved. A wallet is never taken below zero."""
    items, periods = [], []
    for lease in leases:
        if not lease.metered or lease.billed_until is None:
            continue
        accrue(lease, now)
        due = micro(lease.cost_accrued) - lease.cost_charged
        period = (lease.billed_until, lease.accrued_until)
        if period[1] <= period[0] and due <= 0:
            continue
        periods.append((lease, period, due))
        if due > 0:
            gpu = lease.slice.gpu
            items.append(movements.UsageCharge(
                lease_id=lease.pk, buyer_id=lease.buyer_id, provider_id=gpu.node.provider_id, due=due,
                start=period[0], end=period[1], order_id=lease.order_id,
                project_id=lease.order.project_id if lease.order_id else None,
                memo=f"{lease.mode} lease {str(lease.pk)[:8]} {period[0]:%H:%M:%S}-{period[1]:%H:%M:%S}"))
    charged = {p.item.lease_id: p for p in movements.charge_usage(items)}
    out, records = [], []
    for lease, (start_at, end_at), due in periods:
        posted = charged.get(lease.pk)
        amount = posted.amount if posted else ZERO
        lease.cost_charged += amount
        lease.billed_until = max(lease.billed_until, end_at)
        records += _usage_records(lease, start_at, end_at, amount, posted.fee if posted else ZERO,
                                  posted.transaction_id if posted else None)
        out.append(Posted(lease, max(ZERO, due - amount)))
    if periods:
        Lease.objects.bulk_update([lease for lease, _, _ in periods],
                                  ["accrued_until", "cost_accrued", "cost_charged", "billed_until"])
        _write_usage(records)
    return out


def settle(lease: Lease, *, now: datetime) -> Decimal:
    """Post what a single lease owes up to `now` (its end, interruption or price change); returns the shortfall."""
    posted = post([lease], now=now)
    return posted[0].short if posted else ZERO


def _usage_records(lease: Lease, start_at: datetime, end_at: datetime, amount: Decimal, fee: Decimal,
                   txn_id) -> list[UsageRecord]:
    """One record per calendar minute of [start_at, end_at), the charge and its fee spread over them exactly."""
    pieces, t = [], start_at
    while t < end_at:
        stop = min(end_at, minute_of(t) + timedelta(minutes=1))
        pieces.append((minute_of(t), int((stop - t).total_seconds())))
        t = stop
    pieces = [(m, s) for m, s in pieces if s > 0]
    if not pieces:
        return []
    weights = [s for _, s in pieces]
    amounts = spread(amount, weights)
    fees = spread_within(fee, amounts, weights)
    gpu, sl = lease.slice.gpu, lease.slice
    project_id = lease.order.project_id if lease.order_id else None
    return [UsageRecord(lease_id=lease.pk, order_id=lease.order_id, project_id=project_id, buyer_id=lease.buyer_id,
                        provider_id=gpu.node.provider_id, node_id=gpu.node_id,
                        gpu_model=gpu.gpu_model.key if gpu.gpu_model else "", profile=sl.profile or "whole",
                        mode=lease.mode, minute=m, seconds=s, amount=a, fee=f, transaction_id=txn_id)
            for (m, s), a, f in zip(pieces, amounts, fees)]


def _write_usage(records: list[UsageRecord]) -> None:
    try:
        with transaction.atomic():
            UsageRecord.objects.bulk_create(records)
    except IntegrityError:
        # A minute recorded already (a lease metered by an older build mid-minute): add to it, row by row.
        for rec in records:
            row = UsageRecord.objects.select_for_update().filter(lease_id=rec.lease_id, minute=rec.minute).first()
            if row is None:
                rec.save()
            else:
                UsageRecord.objects.filter(pk=row.pk).update(
                    seconds=min(60, row.seconds + rec.seconds), amount=row.amount + rec.amount,
                    fee=row.fee + rec.fee, transaction_id=rec.transaction_id)


# --- the tick ------------------------------------------------------------------------------------------------

@dataclass
class BuyerWarning:
    buyer_id: int
    balance: Decimal
    burn_per_hour: Decimal
    seconds_left: float
    leases: list = field(default_factory=list)


@dataclass
class TickResult:
    posted: int = 0
    stop: list = field(default_factory=list)  # lease ids to end: their buyer's money is (about to be) gone
    warnings: list[BuyerWarning] = field(default_factory=list)


def meter_tick(*, now: datetime | None = None) -> TickResult:
    """Guard every buyer's wallet and post the leases whose last minute is due (see the module doc). The
    caller ends the leases in `stop` and announces `warnings`."""
    now = now or timezone.now()
    result = TickResult()
    running = list(Lease.objects.filter(state=Lease.State.RUNNING, metered=True).only(
        "id", "buyer_id", "price_per_hour", "accrued_until", "cost_accrued", "cost_charged", "billed_until",
        "ends_at", "warned_at", "metered", "state"))
    if not running:
        return result
    stopped = _guard(running, now, result)
    minute = minute_of(now)
    due = sorted((x for x in running if x.billed_until is not None and x.billed_until < minute
                  and x.buyer_id not in stopped), key=lambda x: (x.billed_until, str(x.pk)))
    per_minute = max(1, int(60 / market("METER_SECONDS")))
    limit = max(POST_BATCH_MIN, math.ceil(1.25 * len(running) / per_minute))
    ids = [x.pk for x in due[:limit]]
    if ids:
        with transaction.atomic():
            # Lock the leases: the race is the buyer ending one, or an interruption or a reprice settling it,
            # which would otherwise post the same seconds twice. skip_locked: whoever holds it is settling.
            leases = list(Lease.objects.select_for_update(skip_locked=True, of=("self",)).select_related(*LOCKED)
                          .filter(pk__in=ids, state=Lease.State.RUNNING, metered=True).order_by("pk"))
            posted = post(leases, now=minute)
        result.posted = len(posted)
        result.stop += [p.lease.pk for p in posted if p.short > 0]
    return result


def _guard(running: list[Lease], now: datetime, result: TickResult) -> set:
    by_buyer: dict[int, list[Lease]] = {}
    for lease in running:
        by_buyer.setdefault(lease.buyer_id, []).append(lease)
    balances = ledger.wallet_balances(by_buyer)
    stop_s, warn_s = market("BALANCE_STOP_SECONDS"), market("BALANCE_WARN_SECONDS")
    stopped = set()
    for buyer_id, leases in by_buyer.items():
        burn = sum((x.price_per_hour for x in leases), ZERO)
        if burn <= 0:
            continue
        left = balances.get(buyer_id, ZERO) - sum((owed(x, now) for x in leases), ZERO)
        seconds_left = float(left / burn * 3600)
        if seconds_left < stop_s:
            stopped.add(buyer_id)
            result.stop += [x.pk for x in leases]
        elif seconds_left < warn_s:
            recent = now - timedelta(seconds=warn_s / 3)
            if any(x.warned_at is None or x.warned_at < recent for x in leases):
                result.warnings.append(BuyerWarning(buyer_id=buyer_id, balance=left, burn_per_hour=burn,
                                                    seconds_left=seconds_left, leases=[x.pk for x in leases]))
    return stopped
