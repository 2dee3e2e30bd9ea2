"""Read side of money: monthly buyer statements (selectors: they never write); provider earnings are in earnings.py.

Sums are exact: PostgreSQL adds NUMERIC in the database; on SQLite (whose SUM over NUMERIC goes through
floats) the rows are added in Python as Decimals. Every amount is shown exact (micro-dollars) and rounded
half-up to the cent; a total is rounded from the exact sum, never summed from rounded rows.
"""
from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime, timezone
from decimal import Decimal

from django.db import connection
from django.db.models import Count, F, Max, Min, QuerySet, Sum, Value

from marketplace import amounts
from marketplace.amounts import ZERO
from marketplace.models import Account, LedgerEntry, Project, UsageRecord
from scheduler.errors import DomainError, NotFound



# Wallet movements that are not spending: usage is itemised per slice, top-ups and their refunds move the buyer's
# own money, credits are the platform's money given (shown apart).
NOT_SPENDING = ("usage", "topup", "refund", "credit")
# Ledger kinds as buyers read them.
KIND_LABELS = {"usage": "usage", "reservation": "reserved windows", "resale": "resale market",
               "reversal": "refunds of charges", "credit": "credits", "topup": "top-ups", "refund": "refunds to card"}


def cents(value: Decimal) -> str:
    return str(amounts.cents(value))


def month_bounds(month: str | None) -> tuple[str, datetime, datetime]:
    """'2026-11' → (label, first instant, first instant of the next month), UTC; None → this month."""
    if not month:
        month = month_of(datetime.now(timezone.utc))  # UTC, like the bounds (date.today() is the server's zone)
    if not re.fullmatch(r"\d{4}-\d{2}", month) or not (1 <= int(month[5:]) <= 12) or int(month[:4]) < 2000:
        raise DomainError("month is YYYY-MM, e.g. 2026-11", field="month")
    year, mon = int(month[:4]), int(month[5:])
    start = datetime(year, mon, 1, tzinfo=timezone.utc)
    end = datetime(year + (mon == 12), 1 if mon == 12 else mon + 1, 1, tzinfo=timezone.utc)
    return month, start, end


def month_of(at: datetime) -> str:
    """The UTC calendar month of `at` as 'YYYY-MM'."""
    at = at.astimezone(timezone.utc)
    return f"{at.year:04d}-{at.month:02d}"


def project_spend(*, project_id: int, at: datetime) -> Decimal:
    """A project's spending in the UTC month of `at` up to now, exact: what its statement totals — usage (the
    metered minutes) plus the other charges booked under it (reserved windows paid when booked, resale purchases,
    less refunds of charges); top-ups, refunds to the card and credits are not spending (NOT_SPENDING)."""
    return projects_spend(project_ids=[project_id], at=at)[project_id]


def projects_spend(*, project_ids, at: datetime) -> dict[int, Decimal]:
    """`project_spend` of each project, in two queries whatever their number (the beat's passes over budgets)."""
    ids = list(project_ids)
    _, start, end = month_bounds(month_of(at))
    usage = grouped(UsageRecord.objects.filter(project_id__in=ids, minute__gte=start, minute__lt=end),
                    ["project_id"], ["amount"])
    other = grouped(LedgerEntry.objects.filter(
        project_id__in=ids, account__user_id=F("project__user_id"), account__kind=Account.Kind.WALLET,
        created_at__gte=start, created_at__lt=end)
        .exclude(transaction__kind__in=NOT_SPENDING), ["project_id"], ["amount"])

    def total(sums: dict, pid) -> Decimal:
        return sums.get((pid,), {}).get("amount", ZERO)

    return {pid: total(usage, pid) - total(other, pid) for pid in ids}  # a wallet line of a charge is negative


def grouped(qs: QuerySet, keys: list[str], fields: list[str]) -> dict[tuple, dict[str, Decimal]]:
    """Sum `fields` of `qs` per `keys`, exactly."""
    out: dict[tuple, dict[str, Decimal]] = {}
    if connection.vendor == "postgresql":
        for row in qs.order_by().values(*keys).annotate(**{f"s_{f}": Sum(f) for f in fields}):
            out[tuple(row[k] for k in keys)] = {f: Decimal(row[f"s_{f}"] or 0) for f in fields}
        return out
    for row in qs.order_by().values_list(*keys, *fields).iterator(chunk_size=5000):
        bucket = out.setdefault(tuple(row[:len(keys)]), {f: ZERO for f in fields})
        for f, v in zip(fields, row[len(keys):]):
            bucket[f] += Decimal(v)
    return out


def user_project(*, user, project_id) -> Project:
    """The user's own project, or NotFound (someone else's id looks the same as a missing one)."""
    try:
        return Project.objects.get(pk=int(project_id), user=user)
    except (Project.DoesNotExist, ValueError, TypeError):
        raise NotFound("no such project") from None


def statement(*, user, month: str | None, project_id=None) -> dict:
    """A buyer's month: per project, per slice (GPU model + profile) GPU-seconds and amounts, other charges;
    credits received apart (they are not spending); wallet movements."""
    label, start, end = month_bounds(month)
    usage = UsageRecord.objects.filter(buyer=user, minute__gte=start, minute__lt=end)
    wallet = LedgerEntry.objects.filter(account__user=user, account__kind=Account.Kind.WALLET)
    month_wallet = wallet.filter(created_at__gte=start, created_at__lt=end)
    if project_id not in (None, ""):
        project = user_project(user=user, project_id=project_id)
        usage = usage.filter(project=project)
        month_wallet = month_wallet.filter(project=project)
    slices = grouped(usage, ["project", "gpu_model", "profile"], ["seconds", "amount"])
    moves = grouped(month_wallet, ["project", "transaction__kind"], ["amount"])
    names = dict(Project.objects.filter(user=user).values_list("pk", "name"))
    projects: dict = defaultdict(lambda: {"slices": [], "usage": ZERO, "seconds": ZERO, "other": {}})
    for (pid, model, profile), s in sorted(slices.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1], kv[0][2])):
        p = projects[pid]
        p["slices"].append({"gpu_model": model, "profile": profile or "whole", "gpu_seconds": int(s["seconds"]),
                            "gpu_hours": str((s["seconds"] / 3600).quantize(Decimal("0.0001"))),
                            "amount": str(s["amount"]), "amount_usd": cents(s["amount"])})
        p["usage"] += s["amount"]
        p["seconds"] += s["seconds"]
    totals = defaultdict(lambda: ZERO)
    credits = ZERO
    for (pid, kind), s in moves.items():
        totals[kind] += s["amount"]
        if kind == "credit":  # platform money given (a welcome credit, a short notice): received, not spent
            credits += s["amount"]
        elif kind not in NOT_SPENDING:
            projects[pid]["other"][kind] = projects[pid]["other"].get(kind, ZERO) - s["amount"]
    rows = []
    grand_usage, grand_other, grand_seconds = ZERO, ZERO, ZERO
    for pid in sorted(projects, key=lambda p: (p is not None, names.get(p, ""))):
        p = projects[pid]
        other = sum(p["other"].values(), ZERO)
        grand_usage += p["usage"]
        grand_other += other
        grand_seconds += p["seconds"]
        rows.append({"project": {"id": pid, "name": names.get(pid)} if pid else None, "slices": p["slices"],
                     "gpu_seconds": int(p["seconds"]), "usage_amount": str(p["usage"]),
                     "usage_amount_usd": cents(p["usage"]),
                     "other_charges": [{"kind": k, "label": KIND_LABELS.get(k, k), "amount": str(v),
                                        "amount_usd": cents(v)} for k, v in sorted(p["other"].items())],
                     "total": str(p["usage"] + other), "total_usd": cents(p["usage"] + other)})
    body = {"month": label, "currency": "usd", "period_start": start.isoformat(), "period_end": end.isoformat(),
            "projects": rows,
            "totals": {"gpu_seconds": int(grand_seconds), "usage_amount": str(grand_usage),
                       "usage_amount_usd": cents(grand_usage), "other_charges_amount": str(grand_other),
                       "amount": str(grand_usage + grand_other), "amount_usd": cents(grand_usage + grand_other),
                       "credits_amount": str(credits), "credits_amount_usd": cents(credits)}}
    if project_id in (None, ""):
        opening = exact_sum(wallet.filter(created_at__lt=start))
        closing = opening + sum(totals.values(), ZERO)
        body["wallet"] = {"opening_balance": str(opening), "closing_balance": str(closing),
                          "opening_balance_usd": cents(opening), "closing_balance_usd": cents(closing),
                          "movements": {k: str(v) for k, v in sorted(totals.items())}}
    return body


def exact_sum(qs: QuerySet, field: str = "amount") -> Decimal:
    """The sum of `field` over `qs`, exactly."""
    if connection.vendor == "postgresql":
        return Decimal(qs.aggregate(s=Sum(field))["s"] or 0)
    return sum((Decimal(v) for v in qs.values_list(field, flat=True).iterator(chunk_size=5000)), ZERO)


def statement_csv_rows(body: dict) -> list[list[str]]:
    """The statement as CSV rows: one per slice and per other charge, a subtotal per project, a total."""
    rows = [["month", "project", "item", "gpu_model", "profile", "gpu_seconds", "amount_usd"]]
    for p in body["projects"]:
        name = p["project"]["name"] if p["project"] else ""
        for s in p["slices"]:
            rows.append([body["month"], name, "usage", s["gpu_model"], s["profile"], str(s["gpu_seconds"]),
                         s["amount_usd"]])
        for c in p["other_charges"]:
            rows.append([body["month"], name, c["kind"], "", "", "", c["amount_usd"]])
        rows.append([body["month"], name, "project total", "", "", str(p["gpu_seconds"]), p["total_usd"]])
    rows.append([body["month"], "", "total", "", "", str(body["totals"]["gpu_seconds"]), body["totals"]["amount_usd"]])
    return rows


def wallet_activity(*, user, kind: str | None = None, since: datetime | None = None, until: datetime | None = None,
                    project_id: int | None = None) -> QuerySet:
    """The buyer's wallet as people read it, newest first: one row per movement, except usage, which metering
    posts once a minute per lease and which reads as one row per lease (first and last posting, how many, the
    sum). Rows are dicts: at, first_at, kind, memo, project_name, total, postings, lease (a lease id for usage)."""
    entries = LedgerEntry.objects.filter(account__user=user, account__kind=Account.Kind.WALLET)
    if kind:
        entries = entries.filter(transaction__kind=kind)
    if since is not None:
        entries = entries.filter(created_at__gte=since)
    if until is not None:
        entries = entries.filter(created_at__lte=until)
    if project_id is not None:
        entries = entries.filter(project_id=project_id)
    columns = ("at", "first_at", "kind", "memo", "project_name", "total", "postings", "lease")
    singles = (entries.exclude(transaction__kind="usage")
               .annotate(at=F("created_at"), first_at=F("created_at"), kind=F("transaction__kind"),
                         memo=F("transaction__memo"), project_name=F("project__name"), total=F("amount"),
                         postings=Value(1), lease=F("transaction__lease_id"))
               .values(*columns))
    usage = (entries.filter(transaction__kind="usage").values("transaction__lease_id", "project__name")
             .annotate(at=Max("created_at"), first_at=Min("created_at"), kind=Value("usage"),
                       memo=Value(""), project_name=F("project__name"), total=Sum("amount"), postings=Count("id"),
                       lease=F("transaction__lease_id"))
             .values(*columns))
    # Each side unordered (SQLite refuses ORDER BY inside a compound statement), the union ordered.
    return singles.order_by().union(usage.order_by(), all=True).order_by("-at", "-first_at")
