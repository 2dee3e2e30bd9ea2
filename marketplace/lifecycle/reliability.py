"""The market's part of the reliability score (scheduler/services/reliability.py): which leases a node hosted,
took down and had reported as failed, and the buyer's report of a failed lease."""
from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Count, Q

from marketplace.models import Interruption, Lease, LeaseFailureReport
from scheduler.errors import Conflict, DomainError, NotFound
from scheduler.services.reliability import reliability_refresh_later

from .leases import LOST_REASONS

# Leases a node took down: lost with it, its instance or its container gone (a buyer's own failing container is
# not the node's doing), and spot leases interrupted because the node went offline.
NODE_FAULT_END_REASONS = LOST_REASONS + ("container lost on the node", "container removed on the node")


def lease_record(*, node_ids: list, since: datetime) -> dict:
    """{(node id str, gpu pk): (hosted, taken down by the node, reported failed by its buyer)}; three queries."""
    out: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    leases = Lease.objects.filter(slice__gpu__node_id__in=node_ids, created_at__gte=since)
    for node_id, gpu_id, n in _counted(leases):
        out[(str(node_id), gpu_id)][0] += n
    lost = leases.filter(Q(end_reason__in=NODE_FAULT_END_REASONS) | Q(
        interruption__kind=Interruption.Kind.NODE_OFFLINE))
    for node_id, gpu_id, n in _counted(lost):
        out[(str(node_id), gpu_id)][1] += n
    reports = LeaseFailureReport.objects.filter(node_id__in=node_ids, lease__created_at__gte=since)
    for node_id, gpu_id in reports.values_list("node_id", "gpu_id"):
        out[(str(node_id), gpu_id)][2] += 1
    return {k: tuple(v) for k, v in out.items()}


def _counted(leases):
    return (leases.values_list("slice__gpu__node_id", "slice__gpu_id").annotate(n=Count("pk", distinct=True))
            .order_by())


def lease_failure_report(*, buyer, lease_id, reason: str, note: str = "") -> LeaseFailureReport:
    """Record the buyer's report that its lease failed (once per lease); it counts against the node's and the GPU's
    reliability from the next recompute, which is queued after commit."""
    if reason not in LeaseFailureReport.Reason.values:
        raise DomainError(f"the reason is one of {', '.join(LeaseFailureReport.Reason.values)}", code="invalid_reason")
    lease = Lease.objects.select_related("slice__gpu").filter(pk=lease_id, buyer=buyer).first()
    if lease is None:
        raise NotFound("no such lease of yours")
    if lease.started_at is None and lease.state != Lease.State.FAILED:
        raise Conflict("this lease has not started yet: end it if you no longer want it", code="lease_not_started")
    gpu = lease.slice.gpu
    try:
        with transaction.atomic():
            # The one-to-one on the lease refuses a second report, also when two arrive at once.
            report = LeaseFailureReport.objects.create(lease=lease, reason=reason, note=note.strip()[:500],
                                                       node_id=gpu.node_id, gpu_id=gpu.pk)
            reliability_refresh_later(node_id=gpu.node_id)
    except IntegrityError:
        raise Conflict("you already reported this lease as failed", code="already_reported") from None
    return report
