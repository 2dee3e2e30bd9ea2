"""Relay of OutboxEvent rows to the channel layer, run by each web process (see models.OutboxEvent).

With the in-memory layer of the embedded default it carries what worker and beat send; on Redis, what a
process could not send while Redis was away (services/events.py), so the table is mostly empty and each poll
is one cheap indexed query. Several web processes relay at once: each takes rows no other holds (skip
locked) and deletes them as it takes them; a batch the layer could not take goes back under its ids, so
it keeps its place. A message is delivered at most once by the relay (agents de-duplicate commands by id,
and open commands are re-sent on reconnect anyway).
"""
from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import close_old_connections, transaction

from scheduler.models import OutboxEvent

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25
BATCH = 500


def _take_batch() -> list[OutboxEvent]:
    close_old_connections()
    with transaction.atomic():
        # Rows another web process is taking are skipped, not sent twice.
        rows = list(OutboxEvent.objects.select_for_update(skip_locked=True).order_by("id")[:BATCH])
        if rows:
            OutboxEvent.objects.filter(id__in=[r.pk for r in rows]).delete()
    return rows


def _put_back(rows: list[OutboxEvent]) -> None:
    close_old_connections()
    OutboxEvent.objects.bulk_create(rows)


async def relay_once() -> int:
    """Send one batch; raises what the layer raised after putting back what it did not take."""
    layer = get_channel_layer()
    batch = await database_sync_to_async(_take_batch)()
    for sent, row in enumerate(batch):
        try:
            await layer.group_send(row.group, row.message)
        except BaseException:
            await database_sync_to_async(_put_back)(batch[sent:])
            raise
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
