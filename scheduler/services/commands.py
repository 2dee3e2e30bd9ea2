"""Commands to agents: issued in a transaction, sent after commit, completed by the agent's result.

The agent executes a command id at most once (it answers a repeat with the stored result), so the server
may resend open commands when an agent reconnects.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from nodeagent import protocol
from scheduler.models import AgentCommand, Node, Slice

from scheduler.ports import market

from .events import announce_node, send_to_agent


def command_frame(cmd: AgentCommand) -> dict:
    return protocol.command(id=str(cmd.id), op=cmd.op, args=cmd.args)


def command_issue(*, node: Node, op: str, args: dict, slice: Slice | None = None,
                  timeout: float | None = None) -> AgentCommand:
    """Create a command for `node` and send it to its agent once the surrounding transaction commits."""
    protocol.validate_command(protocol.command(id="check", op=op, args=args))
    timeout = timeout or settings.FLEET["COMMAND_TIMEOUT_SECONDS"]
    cmd = AgentCommand.objects.create(node=node, op=op, args=args, slice=slice,
                                      deadline=timezone.now() + timedelta(seconds=timeout))
    frame = command_frame(cmd)
    transaction.on_commit(lambda: send_to_agent(node.pk, frame))
    return cmd


def commands_mark_sent(*, command_ids: list[str], at: datetime) -> None:
    AgentCommand.objects.filter(pk__in=command_ids, state=AgentCommand.State.PENDING).update(
        state=AgentCommand.State.SENT, sent_at=at)


def commands_open_for(*, node_id) -> list[dict]:
    """Frames of the node's unanswered commands, oldest first, to resend when its agent reconnects."""
    now = timezone.now()
    return [command_frame(c) for c in AgentCommand.objects.filter(
        node_id=node_id, state__in=AgentCommand.OPEN_STATES, deadline__gt=now).order_by("created_at")]


def command_complete(*, node_id, frame: dict) -> AgentCommand | None:
    """Apply an agent's result (validated). Only this node's open (or timed-out) commands can be completed;
    a result for another node's command, an unknown id or a repeat changes nothing and returns None."""
    now = timezone.now()
    with transaction.atomic():
        # The row lock serialises a late duplicate result against the first one and against the timeout
        # sweeper, so a command's effect is applied exactly once.
        # A timed-out command still takes its first late result: a create the agent finished after the
        # deadline made an instance nobody tracks, and only its result can tell us to destroy it.
        cmd = (AgentCommand.objects.select_for_update()
               .filter(pk=_uuid_or_none(frame["id"]), node_id=node_id,
                       state__in=(*AgentCommand.OPEN_STATES, AgentCommand.State.TIMED_OUT))
               .first())
        if cmd is None:
            return None
        cmd.completed_at = now
        if frame["ok"]:
            cmd.state, cmd.result = AgentCommand.State.SUCCEEDED, frame["result"]
        else:
            cmd.state = AgentCommand.State.FAILED
            cmd.error_code = frame["error"]["code"][:40]
            cmd.error_message = frame["error"]["message"][:500]
        cmd.save()
        _apply_effect(cmd, now)
    transaction.on_commit(lambda: announce_node(node_id, {"command": str(cmd.id), "state": cmd.state}))
    return cmd


def _uuid_or_none(value: str):
    import uuid

    try:
        return uuid.UUID(value)
    except (ValueError, TypeError):
        return None


def _apply_effect(cmd: AgentCommand, now: datetime) -> None:
    from .slices import slice_command_finished  # slices issues commands: imported here, not at the top

    if cmd.slice_id is not None:
        slice_command_finished(command=cmd, at=now)
    else:
        market().command_finished(command=cmd)


def commands_expire(*, now: datetime | None = None) -> int:
    """Time out commands past their deadline (beat); their slices fail and release their capacity."""
    now = now or timezone.now()
    count = 0
    with transaction.atomic():
        for cmd in (AgentCommand.objects.select_for_update(skip_locked=True)
                    .filter(state__in=AgentCommand.OPEN_STATES, deadline__lt=now)):
            cmd.state, cmd.completed_at = AgentCommand.State.TIMED_OUT, now
            cmd.error_code, cmd.error_message = "timeout", "the agent did not answer in time"
            cmd.save()
            _apply_effect(cmd, now)
            count += 1
    return count
