"""Reads of the fleet, permission-restricted: a provider sees only its own nodes."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Avg, Count, Prefetch, Q, QuerySet
from django.db.models.functions import TruncHour

from nodeagent.hardware import mig as core_mig
from scheduler.models import Gpu, GpuMetricRollup, HealthEvent, Node, Slice
from scheduler.ports import market


def node_list(*, user) -> QuerySet[Node]:
    """The user's nodes (an operator's: all), without deleted ones."""
    qs = Node.objects.exclude(status=Node.Status.DELETED).annotate(
        gpu_count=Count("gpus", filter=Q(gpus__present=True), distinct=True),
        cordoned_count=Count("gpus", filter=Q(gpus__present=True, gpus__health=Gpu.Health.CORDONED), distinct=True),
    ).select_related("provider").order_by("name")
    return qs if user.is_staff else qs.filter(provider=user)


def node_get(*, user, node_id) -> Node:
    return node_list(user=user).get(pk=node_id)


def node_holders(*, node: Node) -> str | None:
    """What buyers hold on `node` (open leases, reservations), in words, or None: it can be deleted."""
    return market().node_holders(node_id=node.pk)


def gpu_list(*, user) -> QuerySet[Gpu]:
    qs = (Gpu.objects.filter(present=True).exclude(node__status=Node.Status.DELETED)
          .select_related("node", "gpu_model", "latest").order_by("node__name", "index"))
    return qs if user.is_staff else qs.filter(node__provider=user)


def node_gpus(*, node: Node) -> list[Gpu]:
    """The node's GPUs with their active slices and latest metrics, in 3 queries."""
    active = Slice.objects.filter(state__in=Slice.ACTIVE_STATES).order_by("start")
    return list(node.gpus.filter(present=True).select_related("gpu_model", "latest")
                .prefetch_related(Prefetch("slices", queryset=active, to_attr="active_slices")).order_by("index"))


def gpu_layout(gpu: Gpu) -> list[dict]:
    """The memory-slice picture of a GPU: one cell per memory slice, which instance holds it.

    Uses `gpu.active_slices` when prefetched. A non-MIG GPU is one cell.
    """
    slices = getattr(gpu, "active_slices", None)
    if slices is None:
        slices = list(gpu.slices.filter(state__in=Slice.ACTIVE_STATES).order_by("start"))
    geometry = gpu.geometry()
    if geometry is None:
        holder = slices[0] if slices else None
        return [{"index": 0, "span": 1, "slice": holder, "label": "whole GPU" if holder else "free"}]
    owners = core_mig.occupancy(geometry, [core_mig.Instance(s.profile, s.start) for s in slices])
    cells, i = [], 0
    while i < len(owners):
        owner = owners[i]
        j = i
        while j + 1 < len(owners) and owners[j + 1] == owner and owner is not None:
            j += 1
        sl = slices[owner] if owner is not None else None
        cells.append({"index": i, "span": j - i + 1, "slice": sl, "label": sl.profile if sl else "free"})
        i = j + 1
    return cells


def node_events(*, node: Node, limit: int = 20) -> list[HealthEvent]:
    return list(node.health_events.select_related("gpu").order_by("-created_at")[:limit])


def slice_list(*, user) -> QuerySet[Slice]:
    qs = Slice.objects.select_related("gpu__node").order_by("-created_at")
    return qs if user.is_staff else qs.filter(gpu__node__provider=user)


HISTORY_METRICS = ("util", "mem_used", "temp", "power")


def gpu_history(*, gpu_id: int, start: datetime, end: datetime) -> tuple[str, list[dict]]:
    """What a GPU did over [start, end): ("minute", the per-minute averages) for up to two days, else ("hour", hourly
    averages of them), oldest first: each {"at", "util", "mem_used", "temp", "power"} (None where not reported)."""
    rows = GpuMetricRollup.objects.filter(gpu_id=gpu_id, minute__gte=start.replace(second=0, microsecond=0),
                                          minute__lt=end)
    if end - start <= timedelta(days=2):
        return "minute", [{"at": r["minute"], **{m: r[f"{m}_avg"] for m in HISTORY_METRICS}}
                          for r in rows.order_by("minute").values("minute", *(f"{m}_avg" for m in HISTORY_METRICS))]
    hourly = (rows.annotate(hour=TruncHour("minute")).order_by().values("hour")
              .annotate(**{m: Avg(f"{m}_avg") for m in HISTORY_METRICS}).order_by("hour"))
    return "hour", [{"at": r["hour"], **{m: r[m] for m in HISTORY_METRICS}} for r in hourly]
