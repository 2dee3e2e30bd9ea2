"""A lease's workload on its node: what the agent is asked to run (`start`), to stop (`stop`), and what it reports
back recorded on the lease's `WorkloadRun` (`record`, `append_output`). The lease's transitions that follow from
those reports (running, ended at the container's exit, failed) are in leases.py; nothing here moves a lease.

    pending ──start_workload──► pulling ──► starting ──► running ──exit──► exited ─┐
                                   └────────────┴── failed (the engine's reason)     ├─stop_workload──► removed
                                                        running ──stop_workload──► stopping ─┘
"""
from __future__ import annotations

import secrets
from datetime import datetime, timezone as dt_timezone
from decimal import Decimal

from marketplace import events
from marketplace.claims.ports import ports_claim, ports_release
from marketplace.conf import market
from marketplace.models import Lease, Order, PortBinding, Workload, WorkloadRun
from marketplace.pricing import share_of
from scheduler.services.commands import command_issue

START_TIMEOUT_SECONDS = 60.0  # the agent answers start_workload at once; the pull's progress follows as frames


def workload_create(*, order: Order, resolved: dict) -> Workload:
    """The order's workload (inside the order's transaction; `resolved`: products.workloads.workload_resolve's)."""
    return Workload.objects.create(order=order, **resolved)


def workload_of(lease: Lease) -> Workload | None:
    """The workload its order runs (None: a lease that only holds its slice); read through the order when it is
    loaded with it (selectors.lease_list)."""
    if lease.order_id is None:
        return None
    if Lease.order.is_cached(lease) and Order.workload.is_cached(lease.order):
        return getattr(lease.order, "workload", None)
    return Workload.objects.filter(order_id=lease.order_id).first()


def run_of(lease: Lease) -> WorkloadRun | None:
    """Its container's run (None: none was started); read from the lease when it is loaded with it."""
    if Lease.run.is_cached(lease):
        return getattr(lease, "run", None)
    return WorkloadRun.objects.filter(lease=lease).first()


def at_of(ts: float | None) -> datetime | None:
    """A frame's `at` (seconds since the epoch) as a datetime."""
    return datetime.fromtimestamp(ts, tz=dt_timezone.utc) if ts else None


def spec_for(lease: Lease, workload: Workload, ports: list[PortBinding]) -> dict:
    """The start_workload spec (nodeagent.protocol.validate_workload_spec): the lease's device only, CPU and RAM
    in the slice's share of the node's per-GPU figures, the buyer's SSH keys."""
    sl = lease.slice
    gpu, node = sl.gpu, sl.gpu.node
    share = share_of(gpu.geometry(), sl.profile or None)
    env = {e["name"]: e["value"] for e in workload.env}
    if workload.jupyter_token:
        env.setdefault("JUPYTER_TOKEN", workload.jupyter_token)
    keys = list(lease.buyer.ssh_keys.values_list("public_key", flat=True))
    spec = {
        "image": workload.image, "command": list(workload.command), "args": list(workload.args), "env": env,
        "secret_names": sorted(e["name"] for e in workload.env if e.get("secret")),
        "ports": [{"container_port": b.container_port, "host_port": b.host_port, "protocol": b.protocol}
                  for b in ports],
        "limits": {"cpus": float(max(Decimal("0.1"), (node.cpus_per_gpu * share).quantize(Decimal("0.01")))),
                   "memory_mb": max(256, int((node.ram_gb_per_gpu * 1024 * share).to_integral_value())), "disk_gb": workload.disk_gb},
        "device": {"gpu_uuid": gpu.uuid, "instance_uuid": sl.cuda_visible_devices},
        "ssh_keys": keys, "notice": workload.notice, "kind": workload.kind,
    }
    if lease.order is not None and lease.order.duration_seconds and workload.kind == "job":
        spec["max_seconds"] = lease.order.duration_seconds
    return spec


def start(lease: Lease) -> WorkloadRun:
    """The slice is ready: claim the container's host ports and ask the agent to run it (inside the lease's
    transaction; the command goes out on commit). Conflict when the node's port range is full."""
    workload = workload_of(lease)
    run, _ = WorkloadRun.objects.get_or_create(lease=lease)
    if run.ports.exists():
        ports = list(run.ports.all())
    else:
        ports = ports_claim(run=run, node_id=lease.slice.gpu.node_id, wanted=workload.ports)
    command_issue(node=lease.slice.gpu.node, op="start_workload", timeout=START_TIMEOUT_SECONDS,
                  args={"lease": str(lease.pk), "spec": spec_for(lease, workload, ports)})
    events.tell_buyer(lease.buyer_id, {"type": "workload", "lease": str(lease.pk), "state": run.state})
    return run


def stop(lease: Lease, *, grace_seconds: float | None = None) -> bool:
    """Ask the agent to stop and remove the lease's container (SIGTERM, the grace, the kill); False when there is
    none to stop (never started, failed, removed already): the caller destroys the slice at once."""
    run = WorkloadRun.objects.filter(lease=lease).first()  # as it is now (never a copy loaded earlier)
    if run is None or run.state in WorkloadRun.DONE_STATES:
        return False
    grace = market("WORKLOAD_STOP_GRACE_SECONDS") if grace_seconds is None else grace_seconds
    command_issue(node=lease.slice.gpu.node, op="stop_workload",
                  args={"lease": str(lease.pk), "grace_seconds": grace}, timeout=grace + 60)
    if run.state != WorkloadRun.State.EXITED:
        run.state = WorkloadRun.State.STOPPING
        run.save(update_fields=["state", "updated_at"])
    return True


# The order a run moves in; a late report never walks it back (a `running` re-sent after a reconnect, an exit
# reported after we asked it to stop).
_ORDER = ("pending", "pulling", "starting", "running", "exited", "stopping", "removed")


def _advance(current: str, reported: str) -> str:
    if reported in ("failed", "removed"):
        return reported
    if current in WorkloadRun.DONE_STATES:
        return current
    return reported if _ORDER.index(reported) >= _ORDER.index(current) else current


def record(run: WorkloadRun, frame: dict) -> WorkloadRun:
    """A `workload` frame's facts on the run (locked by the caller); the lease's transition is the caller's."""
    state = frame["state"]
    at = at_of(frame.get("at"))
    if frame.get("container"):
        run.container = frame["container"][:128]
    if state == "pulling":
        run.progress = (frame.get("progress") or "")[:300]
    if state == "running":
        run.started_at = run.started_at or at
        run.progress = ""
    if state in ("exited", "removed") and frame.get("exit_code") is not None and run.state != "exited":
        run.exit_code = frame["exit_code"]  # the exit it reported first (a removal after it says it again)
    if state == "exited":
        run.finished_at = at
    if state == "failed":
        run.error = (frame.get("reason") or "the container failed")[:2000]
        run.finished_at = at
    if state == "removed" and run.finished_at is None:
        run.finished_at = at
    run.state = _advance(run.state, state)
    run.save()
    if state in ("failed", "removed"):
        ports_release(run=run)
    return run


def append_output(run: WorkloadRun, data: str) -> None:
    """Keep the last WORKLOAD_LOG_TAIL_BYTES of the container's output on the run."""
    keep = market("WORKLOAD_LOG_TAIL_BYTES")
    tail = (run.log_tail + data)[-keep:]
    WorkloadRun.objects.filter(pk=run.pk).update(log_tail=tail, log_bytes=run.log_bytes + len(data.encode()))


def announce(run: WorkloadRun, lease: Lease) -> None:
    events.tell_buyer(lease.buyer_id, {"type": "workload", "lease": str(lease.pk), "state": run.state,
                                       "progress": run.progress, "exit_code": run.exit_code,
                                       "error": run.error})


def new_jupyter_token() -> str:
    return secrets.token_urlsafe(24)


def connection(lease: Lease) -> dict | None:
    """How the buyer reaches the container (None: the lease runs none): an ssh command for the ssh port, URLs
    for http ports (with the Jupyter token), host:port for the others."""
    run = run_of(lease)
    if run is None:
        return None
    node = lease.slice.gpu.node
    address = node.address
    workload = workload_of(lease)
    out = {"address": address, "ssh": None, "urls": [], "ports": []}
    for b in run.ports.all():
        entry = {"container_port": b.container_port, "host_port": b.host_port, "protocol": b.protocol,
                 "kind": b.kind}
        if b.kind == "ssh" and out["ssh"] is None:
            out["ssh"] = f"ssh -p {b.host_port} root@{address}"
        if b.kind == "http":
            url = f"http://{address}:{b.host_port}/"
            if workload is not None and workload.jupyter_token:
                url += f"?token={workload.jupyter_token}"
            entry["url"] = url
            out["urls"].append(url)
        out["ports"].append(entry)
    if workload is not None and workload.jupyter_token:
        out["jupyter_token"] = workload.jupyter_token
    return out

