"""Read side of a provider's earnings (selectors: they never write): a month per lease, per node and in total, all
three read from the same ledger lines so they always add up; and net earnings per month for a chart.

What a provider earned is every line of its earnings account that is not a payout (movements.PAYOUT_KINDS): metered
usage, reserved windows paid when booked (a window resold later stays its booking's: a resale moves money between
holders' wallets), less the refunds taken back out of earnings (a lease the platform lost, a window it did not
deliver). Each line belongs to the month it was posted in, and to its lease (usage and its
refunds) or to the reserved window of its order (a booking and its refund); gross = net + the platform fee of the
same transactions. A buyer's order and project are used to find the window, never shown: the provider sees its
node, the GPU and profile, the mode and the period.
"""
from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, timezone
from decimal import Decimal

from django.db.models.functions import TruncMonth

from marketplace.amounts import ZERO
from marketplace.models import Account, LedgerEntry, Lease, Reservation, UsageRecord

from .movements import PAYOUT_KINDS
from .statements import cents, grouped, month_bounds

KEYS = ["transaction__lease_id", "transaction__order_id"]


def _earned(account_id, start: datetime, end: datetime):
    return (LedgerEntry.objects.filter(account_id=account_id, created_at__gte=start, created_at__lt=end)
            .exclude(transaction__kind__in=PAYOUT_KINDS))


def _money(net: Decimal, fee: Decimal) -> dict:
    return {"gross": str(net + fee), "fee": str(fee), "net": str(net), "net_usd": cents(net)}


def _node(node) -> dict | None:
    return {"id": str(node.pk), "name": node.name} if node is not None else None


def _items(user, account_id, start: datetime, end: datetime) -> list[dict]:
    """The month's earnings per lease (metered) or reserved window, exact; a line of neither is one "other" row."""
    earned = _earned(account_id, start, end)
    net = grouped(earned, KEYS, ["amount"])
    fees = grouped(LedgerEntry.objects.filter(account__user__isnull=True, account__kind=Account.Kind.PLATFORM_FEES,
                                              transaction_id__in=earned.values("transaction_id")), KEYS, ["amount"])
    # The seconds the month's usage charges paid for (a charge's minutes may lie before the month it was posted in).
    seconds = {k[0]: int(v["seconds"]) for k, v in grouped(
        UsageRecord.objects.filter(provider=user, transaction_id__in=earned.filter(transaction__kind="usage")
                                   .values("transaction_id")), ["lease_id"], ["seconds"]).items()}
    leases = {lease.pk: lease for lease in Lease.objects.filter(pk__in={k[0] for k in net if k[0]})
              .select_related("slice__gpu__node", "slice__gpu__gpu_model")}
    windows = {r.order_id: r for r in Reservation.objects.filter(
        order_id__in={k[1] for k in net if k[0] is None and k[1]}, parent__isnull=True)
        .select_related("gpu__node", "gpu__gpu_model")}
    rows: dict = {}
    for (lease_id, order_id), v in net.items():
        fee = fees.get((lease_id, order_id), {}).get("amount", ZERO)
        lease = leases.get(lease_id)
        window = windows.get(order_id) if lease_id is None else None
        if lease is not None:
            gpu = lease.slice.gpu
            key, row = ("lease", lease.pk), {
                "kind": "lease", "lease": str(lease.pk), "reservation": None, "mode": lease.mode,
                "node": _node(gpu.node), "gpu_model": gpu.gpu_model.key if gpu.gpu_model else "",
                "profile": lease.slice.profile or "whole", "period_start": lease.started_at or lease.created_at,
                "period_end": lease.ended_at, "gpu_seconds": seconds.get(lease.pk, 0)}
        elif window is not None:
            gpu = window.gpu
            key, row = ("reservation", window.pk), {
                "kind": "reservation", "lease": None, "reservation": str(window.pk), "mode": "reserved",
                "node": _node(gpu.node), "gpu_model": gpu.gpu_model.key if gpu.gpu_model else "",
                "profile": window.profile or "whole", "period_start": window.starts_at, "period_end": window.ends_at,
                "gpu_seconds": int((window.ends_at - window.starts_at).total_seconds())}
        else:
            key, row = ("other", None), {
                "kind": "other", "lease": None, "reservation": None, "mode": "", "node": None, "gpu_model": "",
                "profile": "", "period_start": None, "period_end": None, "gpu_seconds": 0}
        row = rows.setdefault(key, {**row, "_net": ZERO, "_fee": ZERO})
        row["_net"] += v["amount"]
        row["_fee"] += fee
    out = []
    for row in sorted(rows.values(), key=lambda r: (r["period_start"] is not None, r["period_start"] or datetime.min),
                      reverse=True):
        net_amount, fee = row.pop("_net"), row.pop("_fee")
        out.append({**row, **_money(net_amount, fee)})
    return out


def earnings(*, user, month: str | None) -> dict:
    """A provider's month: its earnings per lease or reserved window (`leases`), per node and GPU model (`nodes`)
    and in total (`totals`), which add up exactly; the month's earnings ledger by kind (payouts too) and the
    earnings balance now. A fixed number of queries whatever the month holds."""
    label, start, end = month_bounds(month)
    account = Account.objects.filter(user=user, kind=Account.Kind.EARNINGS).values_list("pk", "balance").first()
    items = _items(user, account[0], start, end) if account is not None else []
    nodes: dict = {}
    for item in items:
        key = (item["node"]["id"] if item["node"] else "", item["gpu_model"])
        n = nodes.setdefault(key, {"node": item["node"], "gpu_model": item["gpu_model"], "gpu_seconds": 0,
                                   "_net": ZERO, "_fee": ZERO})
        n["gpu_seconds"] += item["gpu_seconds"]
        n["_net"] += Decimal(item["net"])
        n["_fee"] += Decimal(item["fee"])
    node_rows = []
    for n in sorted(nodes.values(), key=lambda n: ((n["node"] or {}).get("name") or "~", n["gpu_model"])):
        net, fee = n.pop("_net"), n.pop("_fee")
        node_rows.append({**n, **_money(net, fee)})
    net = sum((Decimal(i["net"]) for i in items), ZERO)
    fee = sum((Decimal(i["fee"]) for i in items), ZERO)
    by_kind = grouped(LedgerEntry.objects.filter(account_id=account[0], created_at__gte=start, created_at__lt=end),
                      ["transaction__kind"], ["amount"]) if account is not None else {}
    return {"month": label, "currency": "usd", "period_start": start, "period_end": end, "leases": items,
            "nodes": node_rows,
            "totals": {"gpu_seconds": sum(i["gpu_seconds"] for i in items), **_money(net, fee)},
            "ledger": {k[0]: str(v["amount"]) for k, v in sorted(by_kind.items())},
            "balance": str(account[1] if account is not None else ZERO)}


def monthly_net(*, user, months: int = 6, today: date | None = None) -> list[dict]:
    """Net earnings (payouts left out) of each of the last `months` months, oldest first: one query."""
    today = today or date.today()
    labels = []
    y, m = today.year, today.month
    for _ in range(months):
        labels.append(f"{y:04d}-{m:02d}")
        y, m = (y - 1, 12) if m == 1 else (y, m - 1)
    labels.reverse()
    account_id = Account.objects.filter(user=user, kind=Account.Kind.EARNINGS).values_list("pk", flat=True).first()
    sums: dict = defaultdict(lambda: ZERO)
    if account_id is not None:
        _, start, _ = month_bounds(labels[0])
        _, _, end = month_bounds(labels[-1])
        qs = _earned(account_id, start, end).annotate(month=TruncMonth("created_at", tzinfo=timezone.utc))
        for (when,), v in grouped(qs, ["month"], ["amount"]).items():
            sums[f"{when.year:04d}-{when.month:02d}"] += v["amount"]
    return [{"month": label, "net": sums[label], "net_usd": cents(sums[label])} for label in labels]
