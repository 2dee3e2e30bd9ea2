"""Announcements to live subscribers over the channel layer (always called after commit).

A committed request never fails on this side channel: when the layer cannot take a message (Redis restarting),
the message waits in the outbox and a web process relays it once the layer is back (gateway/relay.py).
"""
from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import DatabaseError
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

# What a channel layer raises when its backing service is away (channels-redis: redis-py's errors).
LAYER_UNREACHABLE = (RedisError, OSError, TimeoutError)


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


def _to_outbox(group: str, message: dict) -> None:
    from scheduler.models import OutboxEvent

    OutboxEvent.objects.create(group=group, message=message)


def _send(group: str, message: dict) -> None:
    if USE_OUTBOX:
        _to_outbox(group, message)
        return
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except LAYER_UNREACHABLE as exc:
        log.warning("channel layer unreachable (%s): %s waits in the outbox", exc, message.get("type"))
        try:
            _to_outbox(group, message)
        except DatabaseError:
            # Both away: the state is committed and agents and consoles re-read it when they reconnect.
            log.exception("channel layer and database unreachable: %s to %s not delivered", message.get("type"),
                          group)


def announce_node(node_id, change: dict) -> None:
    _send(node_group(node_id), {"type": "node.changed", "node": str(node_id), "change": change})


def send_to_agent(node_id, frame: dict) -> None:
    _send(agent_group(node_id), {"type": "agent.command", "frame": frame})


# Why an agent's token stopped working, as its socket is told before it is closed (4401: the agent stops).
REVOKED_SAID = {"rotated": "this node's token was rotated; start the agent with the new one",
                "deleted": "this node was deleted by its provider; its agent is no longer accepted"}


def tell_agent_token_revoked(node_id, *, why: str = "rotated") -> None:
    _send(agent_group(node_id), {"type": "agent.revoked", "why": why})


def tell_agent_uncordoned(node_id, gpu_uuid: str) -> None:
    _send(agent_group(node_id), {"type": "agent.resync", "gpu_uuid": gpu_uuid})


def announce_buyer(user_id, event: dict) -> None:
    _send(buyer_group(user_id), {"type": "market.event", "event": event})


def announce_lease(lease_id, event: dict) -> None:
    _send(lease_group(lease_id), {"type": "market.event", "event": event})
