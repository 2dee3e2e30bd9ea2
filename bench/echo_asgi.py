"""The baseline for bench/metrics_ingest.py: a websocket that echoes each frame back through the channel
layer and nothing else (no validation, no buffering, no fan-out, no database). The same server, layer,
transport and consumer base (no per-message thread hop) as the gateway, so the gap between the two is what
the gateway's own work costs."""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

import django  # noqa: E402

django.setup()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from scheduler.gateway.base import LoopConsumer  # noqa: E402


class EchoConsumer(LoopConsumer):
    async def receive(self, text_data=None, bytes_data=None):
        await self.channel_layer.send(self.channel_name, {"type": "echo", "text": text_data})

    async def echo(self, message):
        await self.send(text_data=message["text"])


application = ProtocolTypeRouter({"websocket": URLRouter([path("ws/echo/", EchoConsumer.as_asgi())])})
