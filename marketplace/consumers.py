"""The console's websocket: a signed-in user subscribes to live data it is allowed to see."""
from __future__ import annotations

import json

from channels.db import database_sync_to_async

from scheduler import selectors as fleet_selectors
from scheduler.gateway.base import LoopConsumer
from scheduler.gateway.relay import RELAY
from scheduler.services.events import buyer_group, lease_group, node_group

MAX_SUBSCRIPTIONS = 50


def _may_watch_node(user, node_id) -> bool:
    try:
        fleet_selectors.node_get(user=user, node_id=node_id)
        return True
    except Exception:  # not found, not theirs, or not a UUID: all the same answer
        return False


def _lease_gpu(user, lease_id) -> tuple[str, str] | None:
    """(node id, GPU uuid) of the user's own open lease, or None: a buyer watches only its lease's GPU, and
    only while the lease holds it (after that the GPU is the next tenant's)."""
    from marketplace.models import Lease

    try:
        row = (Lease.objects.filter(pk=lease_id, buyer=user, state__in=Lease.OPEN_STATES)
               .values_list("slice__gpu__node_id", "slice__gpu__uuid").first())
    except Exception:  # not a UUID: the same answer as not found
        return None
    return (str(row[0]), row[1]) if row else None


class ConsoleConsumer(LoopConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.groups_joined: set[str] = set()
        # node id -> GPU uuids this socket may see there; None = the whole node (its provider, or staff).
        self.visible: dict[str, set[str] | None] = {}
        self.watched_leases: dict[str, tuple[str, str]] = {}  # lease id -> (node id, GPU uuid)
        await self.accept()
        RELAY.ensure_running()  # events written by worker/beat reach this socket (embedded default)
        # Every socket of a user hears that user's market events (lease running, balance low, interruption).
        self.user_group = buyer_group(user.pk)
        await self.channel_layer.group_add(self.user_group, self.channel_name)

    async def disconnect(self, code):
        for group in getattr(self, "groups_joined", ()):
            await self.channel_layer.group_discard(group, self.channel_name)
        if getattr(self, "user_group", None):
            await self.channel_layer.group_discard(self.user_group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        try:
            message = json.loads(text_data or "")
            target = message["subscribe"]
            node_id, lease_id = target.get("node"), target.get("lease")
            if (node_id is None) == (lease_id is None):
                raise KeyError("node or lease")
        except (ValueError, KeyError, TypeError, AttributeError):
            await self.send(text_data=json.dumps(
                {"type": "error", "message": 'send {"subscribe": {"node": ID}} or {"subscribe": {"lease": ID}}'}))
            return
        if len(self.groups_joined) >= MAX_SUBSCRIPTIONS:
            await self.send(text_data=json.dumps({"type": "error", "message": "too many subscriptions"}))
            return
        user = self.scope["user"]
        if lease_id is not None:
            found = await database_sync_to_async(_lease_gpu)(user, lease_id)
            if found is None:
                await self.send(text_data=json.dumps({"type": "error", "message": f"cannot watch lease {lease_id}"}))
                return
            node_id, gpu_uuid = found
            self.watched_leases[str(lease_id)] = found
            # Its container's output goes to the sockets watching it, not to every socket of the buyer.
            await self.channel_layer.group_add(lease_group(lease_id), self.channel_name)
            self.groups_joined.add(lease_group(lease_id))
            if self.visible.get(node_id, set()) is not None:
                self.visible.setdefault(node_id, set()).add(gpu_uuid)
        else:
            if not await database_sync_to_async(_may_watch_node)(user, node_id):
                await self.send(text_data=json.dumps({"type": "error", "message": f"cannot watch node {node_id}"}))
                return
            node_id = str(node_id)
            self.visible[node_id] = None
        group = node_group(node_id)
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.add(group)
        reply = {"type": "subscribed", "node": node_id}
        if lease_id is not None:
            reply["lease"] = str(lease_id)
        await self.send(text_data=json.dumps(reply))

    async def node_metrics(self, message: dict):
        """Forward a node's metrics frame (encoded once by the gateway as `text`)."""
        allowed = self.visible.get(str(message["node"]), None)
        if allowed is None:  # the node's provider (or staff) sees the whole frame as it is
            await self.send(text_data=message["text"])
            return
        frame = json.loads(message["text"])  # a buyer's lease: only its GPU's readings
        frame["gpus"] = [g for g in frame["gpus"] if g.get("uuid") in allowed]
        if frame["gpus"]:
            await self.send(text_data=json.dumps(frame))

    async def node_changed(self, message: dict):
        if self.visible.get(str(message["node"]), None) is not None:
            return  # a node's changes are its provider's business, not a lease holder's
        await self.send(text_data=json.dumps({"type": "changed", "node": message["node"], "change": message["change"]}))

    async def market_event(self, message: dict):
        event = message["event"]
        if event.get("type") in ("lease_ended", "lease_failed"):
            self._stop_watching_lease(str(event.get("lease")))
        await self.send(text_data=json.dumps({"type": "market", "event": message["event"]}))

    def _stop_watching_lease(self, lease_id: str) -> None:
        """The lease is over: its GPU's readings are no longer this user's (unless another open lease of
        theirs, or the whole node, is watched here)."""
        found = self.watched_leases.pop(lease_id, None)
        if found is None:
            return
        node_id, gpu_uuid = found
        allowed = self.visible.get(node_id)
        if allowed is not None and found not in self.watched_leases.values():
            allowed.discard(gpu_uuid)
