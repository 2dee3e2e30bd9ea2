"""Announcements to live subscribers over the channel layer (always called after commit)."""
from __future__ import annotations

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer


def node_group(node_id) -> str:
    """Console subscribers of one node (its metrics, status and layout changes)."""
    return f"console.node.{node_id}"


def agent_group(node_id) -> str:
    """The agent connection(s) of one node: commands go here."""
    return f"agent.{node_id}"


def buyer_group(user_id) -> str:
    """A signed-in user's console sockets: lease events, balance warnings, interruption notices."""
    return f"console.user.{user_id}"


def lease_group(lease_id) -> str:
    """Console sockets watching one lease (its container's output goes only there)."""
    return f"console.lease.{lease_id}"


# Set in Celery worker and beat processes when the channel layer is in-memory (config/celery.py): their
# layer is not the web process's, so messages go through the OutboxEvent table and the web relays them.
USE_OUTBOX = False


def _send(group: str, message: dict) -> None:
    if USE_OUTBOX:
        from scheduler.models import OutboxEvent

        OutboxEvent.objects.create(group=group, message=message)
        return
    layer = get_channel_layer()
    if layer is None:
        return
    async_to_sync(layer.group_send)(group, message)


def announce_node(node_id, change: dict) -> None:
    _send(node_group(node_id), {"type": "node.changed", "node": str(node_id), "change": change})


def send_to_agent(node_id, frame: dict) -> None:
    _send(agent_group(node_id), {"type": "agent.command", "frame": frame})


def tell_agent_token_revoked(node_id) -> None:
    _send(agent_group(node_id), {"type": "agent.revoked"})


def tell_agent_uncordoned(node_id, gpu_uuid: str) -> None:
    _send(agent_group(node_id), {"type": "agent.resync", "gpu_uuid": gpu_uuid})


def announce_buyer(user_id, event: dict) -> None:
    _send(buyer_group(user_id), {"type": "market.event", "event": event})


def announce_lease(lease_id, event: dict) -> None:
    _send(lease_group(lease_id), {"type": "market.event", "event": event})
