"""Slices: carving a MIG instance (or taking a whole GPU) on a concrete GPU, and destroying it.

Capacity is claimed under a row lock on the GPU, so two concurrent requests can never be given
overlapping memory slices; the agent carves the instance after commit and its result makes it ready.
"""
from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from nodeagent.hardware import mig as core_mig
from scheduler.errors import Conflict, DomainError
from scheduler.models import AgentCommand, Gpu, Node, Slice
from scheduler.ports import market

from .commands import command_issue
from .events import announce_node


def slice_create(*, gpu_id: int, profile: str | None, start: int | None = None) -> Slice:
    """Claim a slice (MIG `profile` at `start`, or the whole GPU when profile is None) and tell the agent.

    Raises DomainError with the geometry's reason when the placement is not legal now.
    """
    with transaction.atomic():
        # Lock the GPU row: the race is two requests reading the same free slots and both claiming them.
        gpu = Gpu.objects.select_for_update().select_related("node").get(pk=gpu_id)
        _check_gpu_usable(gpu)
        active = list(gpu.slices.filter(state__in=Slice.ACTIVE_STATES))
        if profile:
            geometry = gpu.geometry()
            if geometry is None:
                raise DomainError(f"{gpu} has MIG off; it can only be rented whole", field="profile")
            if not geometry.has_profile(profile):
                raise DomainError(f"{profile!r} is not a MIG profile of {gpu.name}; known: "
                                  f"{', '.join(p.name for p in geometry.profiles)}", field="profile")
            if any(s.is_whole_gpu for s in active):
                raise Conflict(f"{gpu} is rented whole")
            if start is None:
                starts = core_mig.legal_starts(geometry, [core_mig.Instance(s.profile, s.start) for s in active],
                                               profile)
                if not starts:
                    raise Conflict(f"no legal placement for {profile} on {gpu}", code="no_placement")
                start = starts[0]
            reason = core_mig.why_not(geometry, [core_mig.Instance(s.profile, s.start) for s in active],
                                      profile, start)
            if reason:
                raise Conflict(reason, code="illegal_placement", field="start")
            sl = Slice.objects.create(gpu=gpu, profile=profile, start=start,
                                      size=geometry.profile(profile).memory_slices)
            command_issue(node=gpu.node, op="create_instance", slice=sl,
                          args={"gpu_uuid": gpu.uuid, "profile": profile, "start": start})
        else:
            if active:
                raise Conflict(f"{gpu} has {len(active)} active slices; a whole-GPU slice needs it empty")
            geometry = gpu.geometry()
            if geometry is not None:
                # A whole MIG GPU is its full-size instance (7g on A100/H100), so MIG stays on.
                full = geometry.full_profile
                sl = Slice.objects.create(gpu=gpu, profile=full.name, start=0, size=full.memory_slices)
                command_issue(node=gpu.node, op="create_instance", slice=sl,
                              args={"gpu_uuid": gpu.uuid, "profile": full.name, "start": 0})
            else:
                # A non-MIG GPU needs nothing carved: it is ready at once and its UUID is the device.
                sl = Slice.objects.create(gpu=gpu, profile="", start=0, size=0, state=Slice.State.READY,
                                          ready_at=timezone.now())
    transaction.on_commit(lambda: announce_node(gpu.node_id, {"slice": str(sl.pk), "state": sl.state}))
    return sl


def _check_gpu_usable(gpu: Gpu) -> None:
    if gpu.node.status != Node.Status.ONLINE:
        raise Conflict(f"node {gpu.node} is {gpu.node.status}", code="node_unavailable")
    if gpu.health == Gpu.Health.CORDONED:
        raise Conflict(f"{gpu} is cordoned: {gpu.health_reason}", code="gpu_cordoned")
    if not gpu.present:
        raise Conflict(f"{gpu} is no longer reported by its agent", code="gpu_missing")


def slice_destroy(*, slice_id, by_provider: bool = False) -> Slice:
    """Destroy a slice's instance; it releases its memory slices when the agent confirms. Idempotent.

    `by_provider`: the provider asked by hand (the fleet API), so a slice someone holds (a buyer's lease,
    says the market port) is refused with Conflict; the market's own ending of a lease passes.
    """
    with transaction.atomic():
        # The lock also orders this check against the market settling the same slice.
        sl = Slice.objects.select_for_update().select_related("gpu__node").get(pk=slice_id)
        if sl.state in (Slice.State.DESTROYED, Slice.State.FAILED, Slice.State.DESTROYING):
            return sl
        if by_provider:
            holder = market().slice_holder(sl=sl)
            if holder:
                raise Conflict(f"{holder}: a provider cannot destroy it. The market ends leases: drain "
                               f"the node or cordon the GPU so no new work lands there, and the slice is freed "
                               f"when the lease ends", code="slice_leased")
        if sl.instance_uuid and sl.profile:
            sl.state = Slice.State.DESTROYING
            sl.save(update_fields=["state"])
            slice_destroy_command(sl)
        else:
            # Nothing carved (a whole non-MIG GPU, or creation still pending): released at once. A
            # still-pending create is answered later; its result then destroys the orphan instance.
            sl.state, sl.ended_at = Slice.State.DESTROYED, timezone.now()
            sl.save(update_fields=["state", "ended_at"])
            market().slice_destroyed(sl=sl, at=sl.ended_at)
    transaction.on_commit(lambda: announce_node(sl.gpu.node_id, {"slice": str(sl.pk), "state": sl.state}))
    return sl


def slice_command_finished(*, command: AgentCommand, at: datetime) -> None:
    """Apply a create/destroy result to its slice (called under the command's row lock)."""
    sl = Slice.objects.select_for_update().select_related("gpu__node").get(pk=command.slice_id)
    ok = command.state == AgentCommand.State.SUCCEEDED
    if command.op == "create_instance":
        if ok and sl.state == Slice.State.CREATING:
            sl.state, sl.ready_at = Slice.State.READY, at
            sl.instance_uuid = str(command.result.get("instance_uuid", ""))[:80]
            sl.save()
            market().slice_ready(sl=sl, at=at)
            return
        elif ok:
            # The slice was given up while the agent was carving: destroy what it made.
            command_issue(node=sl.gpu.node, op="destroy_instance",
                          args={"gpu_uuid": sl.gpu.uuid, "instance_uuid": command.result.get("instance_uuid", "")})
            return
        elif sl.state == Slice.State.CREATING:
            sl.state, sl.ended_at = Slice.State.FAILED, at
            sl.error = f"{command.error_code}: {command.error_message}"[:300]
            sl.save()
            market().slice_failed(sl=sl, at=at, reason=sl.error)
    elif command.op == "destroy_instance":
        if sl.state != Slice.State.DESTROYING:
            return  # settled already (a late result of a destroy that was retried)
        # not_found means the instance is already gone: the capacity is free either way.
        if ok or command.error_code == "not_found":
            sl.state, sl.ended_at = Slice.State.DESTROYED, at
            sl.save()
            market().slice_destroyed(sl=sl, at=at)
            return
        sl.error = f"destroy failed: {command.error_code}: {command.error_message}"[:300]
        sl.save()
        # The slice keeps its memory slices until the instance is known to be gone. A timeout on a node
        # that is up is retried now; on an offline node the agent's next hello settles it (nodes.py).
        if command.state == AgentCommand.State.TIMED_OUT and sl.gpu.node.status in (
                Node.Status.ONLINE, Node.Status.DRAINING):
            slice_destroy_command(sl)


def slice_found_carved(*, sl: Slice, instance_uuid: str, at: datetime) -> None:
    """The agent's hello reports an instance at the placement of `sl`, a slice still being carved: the agent made
    it, then died (or lost its socket) before its answer reached us, and a GPU keeps its instances. The instance is
    the slice's: its create command is answered with it (so it is not sent again, which would carve a second one
    or fail on the first), and the slice is ready."""
    command = (AgentCommand.objects.select_for_update()
               .filter(slice=sl, op="create_instance", state__in=AgentCommand.OPEN_STATES).first())
    if command is None:
        return
    command.state, command.completed_at = AgentCommand.State.SUCCEEDED, at
    command.result = {"instance_uuid": instance_uuid, "gpu_uuid": sl.gpu.uuid, "profile": sl.profile,
                      "start": sl.start, "size": sl.size, "found_in": "hello"}
    command.save()
    slice_command_finished(command=command, at=at)


def slice_destroy_command(sl: Slice) -> AgentCommand:
    """Ask the agent (again) to destroy a DESTROYING slice's instance."""
    return command_issue(node=sl.gpu.node, op="destroy_instance", slice=sl,
                         args={"gpu_uuid": sl.gpu.uuid, "instance_uuid": sl.instance_uuid})
