"""A websocket consumer base for sockets that touch the database only through database_sync_to_async."""
from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer
from channels.consumer import get_handler_name

try:  # the server pins orjson: a frame encoded in ~1 µs instead of ~13 µs
    import orjson

    def dumps(obj) -> str:
        return orjson.dumps(obj).decode()
except ImportError:  # pragma: no cover
    import json

    def dumps(obj) -> str:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)


class LoopConsumer(AsyncWebsocketConsumer):
    """Channels' dispatch hops to the sync thread to close stale DB connections before *every* message.

    For an agent sending a frame a second, and console sockets receiving them, that hop is most of the cost
    and queues each message behind whatever runs in the sync thread (a metrics flush). Our consumers never
    use a connection on the event loop: every DB call goes through database_sync_to_async, which closes
    stale connections around itself, so the per-message hop is skipped.
    """

    async def dispatch(self, message):
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)
