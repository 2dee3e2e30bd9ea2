"""The ASGI lifespan of a web process: at shutdown the metrics it buffered are written before it exits.

uvicorn sends `lifespan.shutdown` after it has closed every socket (so no frame arrives later), then
re-raises the SIGTERM/SIGINT it caught, so neither atexit nor the event loop's task cancellation would run.
A server without lifespan support (daphne) loses at most the last FLEET_METRICS_FLUSH seconds of samples.
"""
from __future__ import annotations

import asyncio

from .ingest import INGEST


async def lifespan(scope, receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await asyncio.to_thread(INGEST.close)
            await send({"type": "lifespan.shutdown.complete"})
            return
