"""The in-memory channel layer of the embedded default, without two costs that grow with connections.

Channels' InMemoryChannelLayer scans every channel and group for expired messages on each send and
group_send, and builds a throw-away asyncio.Queue on every send (`setdefault` evaluates its default). With
hundreds of agent sockets in one process those scans dominate the metrics path (bench/metrics_ingest.py).
This subclass cleans at most once per `CLEAN_INTERVAL` seconds and creates a queue only for a new channel;
expiry still holds, a message may just live up to one interval longer.
"""
from __future__ import annotations

import asyncio
import time
from copy import deepcopy

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

CLEAN_INTERVAL = 1.0


class FastInMemoryChannelLayer(InMemoryChannelLayer):
    _last_clean = 0.0

    def _clean_expired(self):
        now = time.monotonic()
        if now - self._last_clean < CLEAN_INTERVAL:
            return
        self._last_clean = now
        super()._clean_expired()

    async def send(self, channel, message):
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        queue = self.channels.get(channel)
        if queue is None:
            queue = self.channels[channel] = asyncio.Queue(maxsize=self.get_capacity(channel))
        try:
            queue.put_nowait((time.time() + self.expiry, deepcopy(message)))
        except asyncio.queues.QueueFull:
            raise ChannelFull(channel)
