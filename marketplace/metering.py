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
   spread evenly over the ticks left in the minute: one ledger transaction per lease per minute (never more than the
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
from django.db.models import Count, ExpressionWrapper, F, FloatField, Q, Sum
from django.utils import timezone

from marketplace.amounts import ZERO, micro, spread, spread_within
from marketplace.conf import market
from marketplace.models import Lease, LedgerTransaction, Mode, UsageRecord
from marketplace.models.sql import Epoch, insert_rows, update_rows
from marketplace.money import ledger, movements
from scheduler.services.transactions import retry_transient

EIGHT = Decimal("0.00000001")
POST_BATCH_MIN = 200  # leases posted per tick at least, when that many are due
LOCKED = ("slice__gpu__node", "slice__gpu__gpu_model", "order")


def billing_start(at: datetime) -> datetime:
    return at.replace(microsecond=0)


def minute_of(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def _seconds_between(accrued_until: datetime | None, ends_at: datetime | None, now: datetime) -> int:
    """Whole seconds from accrued_until to now. Billing never passes the lease's end (its duration, window or
    interruption deadline), whichever beat runs first: the seconds after it are not the buyer's to pay."""
    if accrued_until is None:
        return 0
    until = min(now, ends_at) if ends_at is not None else now
    return max(0, int((until - accrued_until).total_seconds()))


def _seconds(lease: Lease, now: datetime) -> int:
    return _seconds_between(lease.accrued_until, lease.ends_at, now)


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


def accrue(lease: "Lease | Billable", now: datetime) -> None:
    """Fold the whole seconds since accrued_until, at the current price, into cost_accrued (not saved)."""
    seconds = _seconds_between(lease.accrued_until, lease.ends_at, now)
    if seconds:
        lease.cost_accrued = (lease.cost_accrued + lease.price_per_hour * seconds / Decimal(3600)).quantize(EIGHT)
        lease.accrued_until += timedelta(seconds=seconds)


def start(lease: Lease, at: datetime) -> None:
    """Billing starts at `at` (not saved)."""
    lease.accrued_until = lease.billed_until = billing_start(at)


@dataclass(slots=True)
class Billable:
    """What posting needs of a lease, read in one row (a tick posts a thousand of them: no model instances)."""

    pk: object
    buyer_id: int
    provider_id: int
    node_id: object
    order_id: object
    project_id: int | None
    gpu_model: str
    profile: str
    mode: str
    price_per_hour: Decimal
    accrued_until: datetime | None
    cost_accrued: Decimal
    cost_charged: Decimal
    billed_until: datetime | None
    ends_at: datetime | None
    metered: bool

    # The columns of a locked lease row, in this order (meter_tick reads them in one query).
    COLUMNS = ("id", "buyer_id", "slice__gpu__node__provider_id", "slice__gpu__node_id", "order_id",
               "order__project_id", "slice__gpu__gpu_model__key", "slice__profile", "mode", "price_per_hour",
               "accrued_until", "cost_accrued", "cost_charged", "billed_until", "ends_at", "metered")

    @classmethod
    def of(cls, lease: Lease) -> "Billable":
        """From a lease loaded with slice.gpu.node and order (the lifecycle's locked lease)."""
        gpu = lease.slice.gpu
        return cls(lease.pk, lease.buyer_id, gpu.node.provider_id, gpu.node_id, lease.order_id,
                   lease.order.project_id if lease.order_id else None, gpu.gpu_model.key if gpu.gpu_model else "",
                   lease.slice.profile, lease.mode, lease.price_per_hour, lease.accrued_until, lease.cost_accrued,
                   lease.cost_charged, lease.billed_until, lease.ends_at, lease.metered)

    def onto(self, lease: Lease) -> None:
        lease.accrued_until, lease.cost_accrued = self.accrued_until, self.cost_accrued
        lease.cost_charged, lease.billed_until = self.cost_charged, self.billed_until


@dataclass
class Posted:
    lease: Billable
    short: Decimal  # what it owed and its buyer's wallet could not pay (> 0: the money ran out)


def usage_memo(*, mode: str, lease_id, gpu_model: str, profile: str, start: datetime, end: datetime) -> str:
    """What a usage posting reads as in a ledger: "On-demand lease 4e6243f6 (h100-80gb 1g.10gb), 00:57:00–00:57:54
    UTC"."""
    label = {"on_demand": "On-demand"}.get(mode, Mode(mode).label.capitalize() if mode in Mode.values else mode)
    return (f"{label} lease {str(lease_id)[:8]} ({gpu_model or 'GPU'} {profile or 'whole GPU'}), "
            f"{start:%H:%M:%S}–{end:%H:%M:%S} UTC")


def post(leases: list[Billable], *, now: datetime) -> list[Posted]:
    """Charge each lease (locked by the caller) what it owes up to `now` and record its usage per minute; saved.
    A wallet is never taken below zero."""
    items, periods = [], []
    for b in leases:
        if not b.metered or b.billed_until is None:
            continue
        accrue(b, now)
        due = micro(b.cost_accrued) - b.cost_charged
        period = (b.billed_until, b.accrued_until)
        if period[1] <= period[0] and due <= 0:
            continue
        periods.append((b, period, due))
        if due > 0:
            items.append(movements.UsageCharge(
                lease_id=b.pk, buyer_id=b.buyer_id, provider_id=b.provider_id, due=due, start=period[0],
                end=period[1], order_id=b.order_id, project_id=b.project_id,
                memo=usage_memo(mode=b.mode, lease_id=b.pk, gpu_model=b.gpu_model, profile=b.profile,
                                start=period[0], end=period[1])))
    charged = {p.item.lease_id: p for p in movements.charge_usage(items)}
    out, records = [], []
    for b, (start_at, end_at), due in periods:
        posted = charged.get(b.pk)
        amount = posted.amount if posted else ZERO
        b.cost_charged += amount
        b.billed_until = max(b.billed_until, end_at)
        records += _usage_records(b, start_at, end_at, amount, posted.fee if posted else ZERO,
                                  posted.transaction_id if posted else None)
        out.append(Posted(b, max(ZERO, due - amount)))
    if periods:
        update_rows(Lease, ["accrued_until", "cost_accrued", "cost_charged", "billed_until"],
                    [(b.pk, b.accrued_until, b.cost_accrued, b.cost_charged, b.billed_until) for b, _, _ in periods])
        _write_usage(records)
    return out


def settle(lease: Lease, *, now: datetime) -> Decimal:
    """Post what a single lease (locked, loaded as lifecycle loads it) owes up to `now`: its end, interruption
    or price change; the lease object is updated too. Returns the shortfall."""
    b = Billable.of(lease)
    posted = post([b], now=now)
    b.onto(lease)
    return posted[0].short if posted else ZERO


def unbill_after(lease: Lease, *, at: datetime, memo: str) -> Decimal:
    """A lease that stopped running at `at` but was metered past it (its node fell silent at `at` and the meter
    went on through the grace): its accrual goes back to `at` and what it was charged past that is refunded, latest
    charges first (lease locked by the caller; saved). Idempotent: once rewound there is nothing after `at`.
    Returns the amount refunded."""
    if not lease.metered or lease.accrued_until is None or lease.accrued_until <= at:
        return ZERO
    seconds = int((lease.accrued_until - at).total_seconds())
    lease.accrued_until -= timedelta(seconds=seconds)
    lease.cost_accrued = max(ZERO, lease.cost_accrued - lease.price_per_hour * seconds / Decimal(3600)).quantize(EIGHT)
    over, refunded = lease.cost_charged - micro(lease.cost_accrued), ZERO
    for txn in LedgerTransaction.objects.filter(lease_id=lease.pk, kind="usage").order_by("-created_at", "-pk"):
        if over - refunded <= 0:
            break
        left = movements.refundable(original=txn)[1]
        if left > 0:
            amount = min(left, over - refunded)
            movements.refund(original=txn, idempotency_key=f"unbilled:{txn.pk}:{int(lease.accrued_until.timestamp())}",
                             memo=memo[:400], amount=amount)
            refunded += amount
    lease.cost_charged -= refunded
    lease.billed_until = min(lease.billed_until or lease.accrued_until, lease.accrued_until)
    lease.save(update_fields=["accrued_until", "cost_accrued", "cost_charged", "billed_until"])
    return refunded


USAGE_COLUMNS = ["lease_id", "order_id", "project", "buyer", "provider", "node_id", "gpu_model", "profile", "mode",
                 "minute", "seconds", "amount", "fee", "transaction", "created_at"]


def _usage_records(b: Billable, start_at: datetime, end_at: datetime, amount: Decimal, fee: Decimal,
                   txn_id) -> list[tuple]:
    """One record per calendar minute of [start_at, end_at) (values of USAGE_COLUMNS), the charge and its fee
    spread over them exactly."""
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
    now = timezone.now()
    return [(b.pk, b.order_id, b.project_id, b.buyer_id, b.provider_id, b.node_id, b.gpu_model, b.profile or "whole",
             b.mode, m, s, a, f, txn_id, now) for (m, s), a, f in zip(pieces, amounts, fees)]


def _write_usage(records: list[tuple]) -> None:
    try:
        with transaction.atomic():
            insert_rows(UsageRecord, USAGE_COLUMNS, records)
    except IntegrityError:
        # A minute recorded already (a lease metered by an older build mid-minute): add to it, row by row.
        for values in records:
            rec = dict(zip([UsageRecord._meta.get_field(c).attname for c in USAGE_COLUMNS], values))
            row = UsageRecord.objects.select_for_update().filter(lease_id=rec["lease_id"], minute=rec["minute"]).first()
            if row is None:
                UsageRecord.objects.create(**rec)
            else:
                UsageRecord.objects.filter(pk=row.pk).update(
                    seconds=min(60, row.seconds + rec["seconds"]), amount=row.amount + rec["amount"],
                    fee=row.fee + rec["fee"], transaction_id=rec["transaction_id"])


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
    caller ends the leases in `stop` and announces `warnings`. The running leases are read once, summed per
    buyer by the database (10,000 leases are a thousand rows here, not 10,000)."""
    now = now or timezone.now()
    result = TickResult()
    minute = minute_of(now)
    running = Lease.objects.filter(state=Lease.State.RUNNING, metered=True)
    buyers = _burning(running, now=now)
    if not buyers:
        return result
    stopped, warned = _guard(buyers, now, result)
    if stopped:
        result.stop += list(running.filter(buyer_id__in=stopped).values_list("id", flat=True))
    if warned:
        for lease_id, buyer_id in running.filter(buyer_id__in=warned).values_list("id", "buyer_id"):
            warned[buyer_id].leases.append(lease_id)
    due = sum(b[4] for b in buyers if b[0] not in stopped)
    if not due:
        return result
    # Spread the minute's postings evenly over the ticks left in it (a backlog too), so no tick posts them all.
    ticks_left = max(1, math.ceil((minute + timedelta(minutes=1) - now).total_seconds() / market("METER_SECONDS")))
    limit = max(POST_BATCH_MIN, math.ceil(due / ticks_left))

    def post_due() -> list:
        with transaction.atomic():
            # Lock the leases: the race is the buyer ending one, or an interruption or a reprice settling it,
            # which would otherwise post the same seconds twice. skip_locked: whoever holds it is settling.
            batch = [Billable(*row) for row in running.select_for_update(skip_locked=True, of=("self",))
                     .filter(billed_until__lt=minute).exclude(buyer_id__in=stopped).order_by("billed_until", "id")
                     .values_list(*Billable.COLUMNS)[:limit]]
            return post(batch, now=minute)
    # Run again whole when PostgreSQL aborts it to undo a deadlock (the wallets' rows against a top-up or a
    # lease's end): nothing of it was written, and the tick's postings are not left to the next tick.
    posted = retry_transient(post_due)
    result.posted = len(posted)
    result.stop += [p.lease.pk for p in posted if p.short > 0]
    return result


def _burning(running, *, now: datetime) -> list[tuple]:
    """Per buyer of `running` leases: (buyer_id, burn per hour, accrued and not charged, sum of price x accrued_until,
    leases due a posting, leases not warned lately), summed by the database."""
    warn_s = market("BALANCE_WARN_SECONDS")
    return list(running.order_by().values("buyer_id").annotate(
        burn=Sum("price_per_hour"), unposted=Sum(F("cost_accrued") - F("cost_charged")),
        since=Sum(ExpressionWrapper(F("price_per_hour") * Epoch("accrued_until"), output_field=FloatField())),
        due=Count("id", filter=Q(billed_until__lt=minute_of(now))),
        unwarned=Count("id", filter=Q(warned_at__isnull=True) | Q(warned_at__lt=now - timedelta(seconds=warn_s / 3))),
    ).values_list("buyer_id", "burn", "unposted", "since", "due", "unwarned"))


def _runway(balance: Decimal, burn, unposted, since, clock: float) -> tuple[float, float]:
    """(money left after what the leases owe, seconds it lasts at `burn` per hour): a threshold, in floats."""
    burn = float(burn or 0)
    # sum of price x (now - accrued_until) over its leases, per hour, plus what is accrued and not charged
    owing = float(unposted or 0) + (clock * burn - float(since or 0)) / 3600
    left = float(balance) - max(0.0, owing)
    return left, (left / burn * 3600 if burn > 0 else math.inf)


@dataclass(frozen=True)
class Runway:
    balance: Decimal  # the wallet less what its running leases owe and the ledger has not charged yet
    burn_per_hour: Decimal
    seconds_left: float


def wallet_runways(*, now: datetime | None = None) -> dict[int, Runway]:
    """How long each buyer with running metered leases has before the wallet runs out at the current burn rate
    (the same sums the tick's guard uses); buyers without such leases are absent."""
    now = now or timezone.now()
    buyers = _burning(Lease.objects.filter(state=Lease.State.RUNNING, metered=True), now=now)
    balances = ledger.wallet_balances(b[0] for b in buyers)
    out = {}
    for buyer_id, burn, unposted, since, _, _ in buyers:
        if float(burn or 0) <= 0:
            continue
        left, seconds = _runway(balances.get(buyer_id, ZERO), burn, unposted, since, now.timestamp())
        out[buyer_id] = Runway(balance=micro(Decimal(repr(left))), burn_per_hour=micro(Decimal(burn)),
                               seconds_left=seconds)
    return out


def _guard(buyers: list[tuple], now: datetime, result: TickResult) -> tuple[set, dict]:
    """Which buyers' leases stop (under BALANCE_STOP_SECONDS of money at their burn rate, counting what their
    leases owe and the ledger has not charged: a threshold, in floats) and which are warned."""
    balances = ledger.wallet_balances(b[0] for b in buyers)
    stop_s, warn_s = market("BALANCE_STOP_SECONDS"), market("BALANCE_WARN_SECONDS")
    stopped, warned = set(), {}
    clock = now.timestamp()
    for buyer_id, burn, unposted, since, _, unwarned in buyers:
        burn = float(burn or 0)
        if burn <= 0:
            continue
        left, seconds_left = _runway(balances.get(buyer_id, ZERO), burn, unposted, since, clock)
        if seconds_left < stop_s:
            stopped.add(buyer_id)
        elif seconds_left < warn_s and unwarned:
            warned[buyer_id] = BuyerWarning(buyer_id=buyer_id, balance=micro(Decimal(repr(left))),
                                            burn_per_hour=micro(Decimal(repr(burn))), seconds_left=seconds_left)
    result.warnings += list(warned.values())
    return stopped, warned
