"""What must hold after any fault (issue 10): no slice leaked, no second billed that did not run nor one left
unbilled, the ledger balanced, every order running or ended (and refunded when the platform lost it), no
duplicate instance. Checked in the cluster's own database by one Django shell."""
from __future__ import annotations

import json

CHECK = r"""
import json
from datetime import timedelta
from decimal import Decimal
from django.db.models import Sum
from django.utils import timezone
from marketplace.lifecycle.leases import LOST_REASONS
from marketplace.models import Lease, LedgerEntry, LedgerTransaction, Mode, Order
from marketplace.money.check import ledger_check
from scheduler.models import Slice

problems = [f"ledger: {p}" for p in ledger_check()]
now = timezone.now()
settle = timedelta(seconds=%(settle)s)

# Slices: a live one is held by an open lease (or adopted from the GPU); one GPU's live slices never overlap; one
# instance UUID is never two live slices.
live = list(Slice.objects.filter(state__in=Slice.ACTIVE_STATES).select_related("gpu"))
leases = {l.slice_id: l for l in Lease.objects.filter(slice__in=[s.pk for s in live])}
for sl in live:
    lease = leases.get(sl.pk)
    if lease is None and not sl.error.startswith("adopted"):
        problems.append(f"slice {sl.pk} on {sl.gpu.uuid} is {sl.state} with no lease")
    elif lease is not None and lease.state not in Lease.OPEN_STATES and sl.state != Slice.State.DESTROYING:
        problems.append(f"slice {sl.pk} is {sl.state} but its lease {lease.pk} is {lease.state}")
by_gpu = {}
for sl in live:
    by_gpu.setdefault(sl.gpu_id, []).append(sl)
for gpu_id, slices in by_gpu.items():
    spans = sorted((s.start, s.start + max(s.size, 1), str(s.pk)) for s in slices)
    for (a0, a1, a), (b0, b1, b) in zip(spans, spans[1:]):
        if b0 < a1:
            problems.append(f"slices {a} and {b} overlap on GPU {gpu_id}")
uuids = [s.instance_uuid for s in live if s.instance_uuid]
for u in {u for u in uuids if uuids.count(u) > 1}:
    problems.append(f"instance {u} is {uuids.count(u)} live slices")

# Leases: settled ones are billed exactly their running seconds at their price (on-demand: a fixed price);
# lost ones are refunded; nothing open is stuck.
for lease in Lease.objects.select_related("order"):
    usage = -(LedgerEntry.objects.filter(transaction__lease_id=lease.pk, transaction__kind="usage",
                                         account__kind="wallet").aggregate(s=Sum("amount"))["s"] or Decimal(0))
    refunded = LedgerEntry.objects.filter(transaction__lease_id=lease.pk, transaction__kind="refund",
                                          account__kind="wallet").aggregate(s=Sum("amount"))["s"] or Decimal(0)
    if lease.state in Lease.OPEN_STATES and lease.state != Lease.State.RUNNING \
            and now - (lease.started_at or lease.created_at) > settle and lease.state == Lease.State.PROVISIONING:
        problems.append(f"lease {lease.pk} is still provisioning after {(now - lease.created_at).seconds} s")
    if lease.mode == Mode.ON_DEMAND and lease.metered and lease.started_at and lease.accrued_until:
        # Billing starts at the whole second the lease started in (metering.billing_start).
        seconds = int((lease.accrued_until - lease.started_at.replace(microsecond=0)).total_seconds())
        expected = (lease.price_per_hour * seconds / Decimal(3600)).quantize(Decimal("0.00000001"))
        if abs(lease.cost_accrued - expected) > Decimal("0.00000001"):
            problems.append(f"lease {lease.pk}: accrued {lease.cost_accrued} for {seconds} s at "
                            f"{lease.price_per_hour}/h, expected {expected}")
        stop = lease.ended_at if lease.state in (Lease.State.ENDED, Lease.State.FAILED) else None
        if stop is not None and lease.accrued_until > stop + timedelta(seconds=1):
            problems.append(f"lease {lease.pk} billed until {lease.accrued_until}, after it ended at {stop}")
        if lease.state == Lease.State.ENDED and lease.end_reason not in LOST_REASONS and usage - refunded < 0:
            problems.append(f"lease {lease.pk}: refunded {refunded} more than its usage {usage}")
    if lease.state == Lease.State.FAILED and usage - refunded != 0:
        problems.append(f"failed lease {lease.pk} kept {usage - refunded} of its charges")

# Orders: placed ones have a running lease or are over; queued ones wait; none is stuck between.
for order in Order.objects.filter(state=Order.State.PLACED):
    states = set(order.leases.values_list("state", flat=True))
    if not states:
        problems.append(f"order {order.pk} is placed with no lease")
print("INVARIANTS" + json.dumps(problems))
"""


def invariants(cluster, *, settle_seconds: float = 30) -> list[str]:
    out = cluster._run("manage.py", "shell", "-c", CHECK % {"settle": settle_seconds})
    return json.loads(out[out.index("INVARIANTS") + len("INVARIANTS"):])


def assert_invariants(cluster, **kwargs) -> None:
    problems = invariants(cluster, **kwargs)
    assert problems == [], "\n".join(problems)
