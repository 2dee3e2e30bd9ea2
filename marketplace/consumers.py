"""The console's websocket: a signed-in user subscribes to live data it is allowed to see."""
from __future__ import annotations

import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from scheduler import selectors as fleet_selectors
from scheduler.gateway.relay import RELAY
from scheduler.services.events import buyer_group, node_group

MAX_SUBSCRIPTIONS = 50


def _may_watch_node(user, node_id) -> bool:
    try:
        fleet_selectors.node_get(user=user, node_id=node_id)
        return True
    except Exception:  # not found, not theirs, or not a UUID: all the same answer
        return False


class ConsoleConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.groups_joined: set[str] = set()
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
            node_id = message["subscribe"]["node"]
        except (ValueError, KeyError, TypeError):
            await self.send(text_data=json.dumps({"type": "error", "message": 'send {"subscribe": {"node": ID}}'}))
            return
        if len(self.groups_joined) >= MAX_SUBSCRIPTIONS or not await database_sync_to_async(_may_watch_node)(
                self.scope["user"], node_id):
            await self.send(text_data=json.dumps({"type": "error", "message": f"cannot watch node {node_id}"}))
            return
        group = node_group(node_id)
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.add(group)
        await self.send(text_data=json.dumps({"type": "subscribed", "node": str(node_id)}))

    async def node_metrics(self, message: dict):
        await self.send(text_data=json.dumps({"type": "metrics", "node": message["node"], "ts": message["ts"],
                                              "sent": message.get("sent"), "gpus": message["gpus"]}))

    async def node_changed(self, message: dict):
        await self.send(text_data=json.dumps({"type": "changed", "node": message["node"], "change": message["change"]}))

    async def market_event(self, message: dict):
        await self.send(text_data=json.dumps({"type": "market", "event": message["event"]}))
