"""The baseline for bench/metrics_ingest.py: a websocket that passes each frame through the channel layer
and nothing else (no parsing, validation, buffering, fan-out or database). The same server, layer,
transport and consumer base (no per-message thread hop) as the gateway, so the gap between the two is what
the gateway's own work costs.

Each frame is counted when it comes out of the layer (`GET /count` answers the total), so the ceiling is
read on the server, as the gateway's is; with `?reply=1` the frame is also sent back, for the latency.
"""
import json
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

import django  # noqa: E402

django.setup()

from channels.exceptions import ChannelFull  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from scheduler.gateway.base import LoopConsumer  # noqa: E402


FRAMES = 0


class EchoConsumer(LoopConsumer):
    async def connect(self):
        self.reply = b"reply=1" in self.scope.get("query_string", b"")
        await self.accept()

    async def receive(self, text_data=None, bytes_data=None):
        try:
            await self.channel_layer.send(self.channel_name, {"type": "echo", "text": text_data})
        except ChannelFull:  # a full channel drops the frame, as group_send does for the gateway
            pass

    async def echo(self, message):
        global FRAMES
        FRAMES += 1
        if self.reply:
            await self.send(text_data=message["text"])


async def count(scope, receive, send):
    body = json.dumps({"frames": FRAMES}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


application = ProtocolTypeRouter({"websocket": URLRouter([path("ws/echo/", EchoConsumer.as_asgi())]),
                                  "http": count})
