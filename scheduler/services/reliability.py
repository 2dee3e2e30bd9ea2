"""Gather what was recorded about each node and GPU over the window, score it (scheduler.core.reliability) and store
the score with its parts on the node and the GPU: the catalog's reliability filter and the scheduler's reliability
term read them. Recomputed by the beat (fleet.reliability) and, after commit, for a node that had a health event or
a buyer's failure report."""
from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from config.celery import run_task
from scheduler.core import reliability as core
from scheduler.models import AgentCommand, Gpu, HealthEvent, Node
from scheduler.ports import market

log = logging.getLogger(__name__)

PROVISIONING_OPS = ("create_instance", "destroy_instance")
UP_KINDS, DOWN_KINDS = ("online", "connected"), ("offline",)
FAILED_COMMAND_STATES = (AgentCommand.State.FAILED, AgentCommand.State.TIMED_OUT)
CHUNK = 500


def config() -> core.Config:
    """The weights and penalties in settings.RELIABILITY (core defaults for what it leaves out)."""
    r = settings.RELIABILITY
    return core.Config(weights={**core.DEFAULT_WEIGHTS, **r.get("WEIGHTS", {})},
                       penalties={**core.DEFAULT_PENALTIES, **r.get("PENALTIES", {})})


def health_causes(event_kind: str, detail: dict) -> list[str]:
    """The score's names for one recorded health event: "xid:<code>" per code of an XID event, and the causes of a
    health-check cordon (thermal, power, ecc; its XIDs were recorded as XID events already)."""
    if event_kind == "xid":
        return [f"xid:{c}" for c in detail.get("codes", []) if isinstance(c, int)]
    if event_kind == "cordon" and detail.get("source") == Gpu.CordonedBy.HEALTH:
        return [c for c in detail.get("causes", []) if c in ("thermal", "power", "ecc")]
    return []


def _online_seconds(events: list[tuple[datetime, str]], *, start: datetime, now: datetime,
                    up_at_start: bool) -> float:
    """Seconds online in [start, now] from the node's ordered up/down transitions."""
    up, since, total = up_at_start, start, 0.0
    for at, kind in events:
        if kind in DOWN_KINDS and up:
            total += (at - since).total_seconds()
            up = False
        elif kind in UP_KINDS and not up:
            up, since = True, at
    if up:
        total += (now - since).total_seconds()
    return total


def node_evidence(*, node_ids: list, now: datetime) -> tuple[dict, dict]:
    """({node id str: Evidence}, {gpu pk: Evidence}) over the window; a handful of queries for any number of nodes."""
    window = timedelta(days=settings.RELIABILITY["WINDOW_DAYS"])
    since = now - window
    nodes = {str(n.pk): n for n in Node.objects.filter(pk__in=node_ids)}
    by_node = {k: core.Evidence() for k in nodes}
    gpus = dict(Gpu.objects.filter(node_id__in=node_ids).values_list("pk", "node_id"))
    by_gpu = {pk: core.Evidence() for pk in gpus}
    # uptime: the window starts when the node first connected (a node still pending has no record yet)
    transitions: dict[str, list] = defaultdict(list)
    for node_id, at, kind in (HealthEvent.objects.filter(node_id__in=node_ids, kind__in=UP_KINDS + DOWN_KINDS)
                              .order_by("created_at").values_list("node_id", "created_at", "kind")):
        transitions[str(node_id)].append((at, kind))
    for key, ev in by_node.items():
        seen = transitions.get(key, [])
        first_up = next((at for at, kind in seen if kind in UP_KINDS), None)
        if first_up is None:
            continue
        start = max(first_up, since)
        before = [kind for at, kind in seen if at <= start]
        ev.window_seconds = (now - start).total_seconds()
        ev.online_seconds = _online_seconds([(at, k) for at, k in seen if at > start], start=start, now=now,
                                            up_at_start=before[-1] in UP_KINDS if before else True)
    # provisioning: slice commands answered in the window
    for gpu_id, state, n in (AgentCommand.objects.filter(node_id__in=node_ids, op__in=PROVISIONING_OPS,
                                                         created_at__gte=since, slice__isnull=False)
                             .exclude(state__in=AgentCommand.OPEN_STATES)
                             .values_list("slice__gpu_id", "state").annotate(n=Count("pk")).order_by()):
        ev = by_gpu.get(gpu_id)
        if ev is None:
            continue
        if state == AgentCommand.State.SUCCEEDED:
            ev.commands_succeeded += n
        elif state in FAILED_COMMAND_STATES:
            ev.commands_failed += n
    # health events, by cause (XID by code)
    for node_id, gpu_id, kind, detail in HealthEvent.objects.filter(
            node_id__in=node_ids, kind__in=("xid", "cordon"), created_at__gte=since).values_list(
            "node_id", "gpu_id", "kind", "detail"):
        target = by_gpu.get(gpu_id) if gpu_id is not None else by_node.get(str(node_id))
        for cause in () if target is None else health_causes(kind, detail or {}):
            target.health[cause] = target.health.get(cause, 0) + 1
    # leases: hosted, taken down by the node, reported failed (the market's records)
    for (node_id, gpu_id), (hosted, caused, reports) in market().lease_record(node_ids=list(nodes),
                                                                              since=since).items():
        ev = by_gpu.get(gpu_id)
        if ev is not None:
            ev.leases_hosted += hosted
            ev.interruptions_caused += caused
            ev.buyer_reports += reports
    for pk, node_id in gpus.items():
        node_ev, gpu_ev = by_node[str(node_id)], by_gpu[pk]
        node_ev.add(gpu_ev)
    for pk, node_id in gpus.items():
        # a GPU lives as long as its node is up
        by_gpu[pk].window_seconds = by_node[str(node_id)].window_seconds
        by_gpu[pk].online_seconds = by_node[str(node_id)].online_seconds
    return by_node, by_gpu


def reliability_recompute(*, node_ids: list | None = None, now: datetime | None = None) -> int:
    """Score the nodes (all that are not deleted when None) and their GPUs and store each score with its parts;
    the number of nodes scored."""
    now = now or timezone.now()
    if node_ids is None:
        node_ids = list(Node.objects.exclude(status=Node.Status.DELETED).values_list("pk", flat=True))
    if len(node_ids) > CHUNK:  # a few queries per chunk of nodes, whatever the fleet's size
        return sum(reliability_recompute(node_ids=node_ids[i:i + CHUNK], now=now)
                   for i in range(0, len(node_ids), CHUNK))
    if not node_ids:
        return 0
    cfg = config()
    by_node, by_gpu = node_evidence(node_ids=node_ids, now=now)
    nodes, gpus = [], []
    for key, ev in by_node.items():
        s = core.score(ev, cfg)
        nodes.append(Node(pk=key, reliability=s.score, reliability_detail=s.to_dict(), reliability_at=now))
    for pk, ev in by_gpu.items():
        s = core.score(ev, cfg)
        gpus.append(Gpu(pk=pk, reliability=s.score, reliability_detail=s.to_dict()))
    # Only the score's own columns are written: a concurrent status or health change is not overwritten.
    with transaction.atomic():
        Node.objects.bulk_update(nodes, ["reliability", "reliability_detail", "reliability_at"], batch_size=500)
        Gpu.objects.bulk_update(gpus, ["reliability", "reliability_detail"], batch_size=500)
    return len(by_node)


def _recompute_quietly(node_id) -> None:
    try:
        reliability_recompute(node_ids=[node_id])
    except Exception:  # the beat recomputes it anyway: an event must not fail for its score
        log.exception("reliability recompute of node %s failed", node_id)


def reliability_refresh_later(*, node_id) -> None:
    """Rescore the node once the surrounding transaction commits (a health event, a buyer's report), at most once
    per EVENT_RESCORE_SECONDS: a GPU reporting XIDs in a burst costs the gateway one rescore at the first event and
    the worker one at the end of the window (which reads every event of the burst), not one per event. With the
    cache (Redis) away neither runs and the beat's recompute catches up within RECOMPUTE_SECONDS."""
    transaction.on_commit(lambda: _rescore_soon(node_id))


def _rescore_soon(node_id) -> None:
    window = settings.RELIABILITY["EVENT_RESCORE_SECONDS"]
    if cache.add(f"reliability:rescored:{node_id}", 1, timeout=window):
        _recompute_quietly(node_id)
    elif cache.add(f"reliability:due:{node_id}", 1, timeout=window):
        run_task("fleet.reliability_node", node_id=str(node_id), countdown=window)
