"""Relay of OutboxEvent rows to the channel layer, run by each web process (see models.OutboxEvent).

Only needed with the in-memory layer of the embedded default; with Redis the table stays empty and each
poll is one cheap indexed query. Rows are deleted once sent: a message is delivered at most once by the
relay (agents de-duplicate commands by id, and open commands are re-sent on reconnect anyway).
"""
from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25
BATCH = 500


def _take_batch() -> list[tuple[str, dict]]:
    from django.db import close_old_connections, transaction

    from scheduler.models import OutboxEvent

    close_old_connections()
    with transaction.atomic():
        rows = list(OutboxEvent.objects.order_by("id").values_list("id", "group", "message")[:BATCH])
        if rows:
            OutboxEvent.objects.filter(id__in=[r[0] for r in rows]).delete()
    return [(group, message) for _, group, message in rows]


async def relay_once() -> int:
    layer = get_channel_layer()
    batch = await database_sync_to_async(_take_batch)()
    for group, message in batch:
        await layer.group_send(group, message)
    return len(batch)


class Relay:
    def __init__(self) -> None:
        self._task: asyncio.Task | None = None
        self._loop = None

    def ensure_running(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is not None and self._loop is loop and not self._task.done():
            return
        self._loop, self._task = loop, loop.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                if not await relay_once():
                    await asyncio.sleep(POLL_SECONDS)
            except Exception:
                log.exception("outbox relay failed")
                await asyncio.sleep(POLL_SECONDS * 4)


RELAY = Relay()
