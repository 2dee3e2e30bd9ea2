"""Metrics ingest: samples are kept in memory and written in batches, not one row per sample.

Every flush a web process upserts the latest sample per GPU, merges the samples it took since the last
flush into each GPU-minute's min/avg/max rollup (one INSERT ... ON CONFLICT per table; the merge adds to
what is there, so a node that reconnects to another web process within a minute loses nothing), and stamps
the heartbeat of every node heard from (one UPDATE). A failed flush keeps what it took for the next one;
through a long database outage the kept GPU-minute aggregates are capped (FLEET_METRICS_BUFFER_MAX_ROLLUPS):
the oldest minutes are dropped, counted and logged, so the web process's memory stays bounded.

The web process only buffers: each flush is written by its writer process (scheduler/gateway/writer.py),
so the upserts never hold the interpreter lock the websocket loop runs under; a writer that dies is
started again and its flush retried, and at shutdown what is left is written before the writer ends. Where
another process cannot reach the database (SQLite in memory: tests) or FLEET_METRICS_WRITER_PROCESS is
off, the flush is written in a thread of the web process instead.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone as dt_timezone

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections

from .writer import WriterProcess

log = logging.getLogger(__name__)

ROLLUP_FIELDS = (("util", "util"), ("mem_used_mib", "mem_used"), ("temp_c", "temp"), ("power_w", "power"))


@dataclass
class _Agg:
    """Running min/avg/max of one GPU-minute; a null reading counts in `n` but not in that metric."""

    n: int = 0
    counts: list = field(default_factory=lambda: [0] * len(ROLLUP_FIELDS))
    sums: list = field(default_factory=lambda: [0.0] * len(ROLLUP_FIELDS))
    mins: list = field(default_factory=lambda: [float("inf")] * len(ROLLUP_FIELDS))
    maxs: list = field(default_factory=lambda: [float("-inf")] * len(ROLLUP_FIELDS))

    def __reduce__(self):  # pickled to the writer process as its fields: a third less time than a dataclass's
        return _Agg, (self.n, self.counts, self.sums, self.mins, self.maxs)

    def add(self, sample: dict) -> None:
        self.n += 1
        for i, (key, _) in enumerate(ROLLUP_FIELDS):
            v = sample.get(key)
            if v is None:
                continue
            self.counts[i] += 1
            self.sums[i] += v
            if v < self.mins[i]:
                self.mins[i] = v
            if v > self.maxs[i]:
                self.maxs[i] = v

    def merge(self, other: "_Agg") -> None:
        self.n += other.n
        for i in range(len(ROLLUP_FIELDS)):
            self.counts[i] += other.counts[i]
            self.sums[i] += other.sums[i]
            self.mins[i] = min(self.mins[i], other.mins[i])
            self.maxs[i] = max(self.maxs[i], other.maxs[i])


class MetricsIngest:
    def __init__(self, *, process: bool | None = None) -> None:
        """`process`: write flushes through a writer process (None: FLEET_METRICS_WRITER_PROCESS, where the
        database can be reached from another process)."""
        self.process = process
        self.writer: WriterProcess | None = None
        self.latest: dict[int, tuple[float, dict]] = {}  # gpu pk -> (ts, sample)
        self.rollups: dict[tuple[int, int], _Agg] = {}  # (gpu pk, minute epoch) -> samples since last flush
        self.heard: dict = {}  # node pk -> ts
        self.samples_total = 0
        self.rollups_dropped = 0  # GPU-minute aggregates given up while the database was away
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, *, node_id, ts: float, samples: list[tuple[int, dict]]) -> None:
        """Take one validated metrics batch: [(gpu pk, sample)]. O(GPUs), no I/O."""
        minute = int(ts // 60) * 60
        for gpu_id, sample in samples:
            self.latest[gpu_id] = (ts, sample)
            key = (gpu_id, minute)
            agg = self.rollups.get(key)
            if agg is None:
                agg = self.rollups[key] = _Agg()
            agg.add(sample)
        self.heard[node_id] = ts
        self.samples_total += len(samples)

    def ensure_running(self) -> None:
        """Start the periodic flusher on the current event loop (once per loop)."""
        loop = asyncio.get_running_loop()
        if self._task is not None and self._loop is loop and not self._task.done():
            return
        self._loop = loop
        self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        interval = settings.FLEET["METRICS_FLUSH_SECONDS"]
        while True:
            await asyncio.sleep(interval)
            try:
                await self.flush()
            except Exception:  # a failed flush must not stop later ones; the samples are retried
                log.exception("metrics flush failed")

    async def flush(self) -> int:
        """Write what has been buffered; returns the number of GPUs whose latest sample was written."""
        latest, self.latest = self.latest, {}
        rollups, self.rollups = self.rollups, {}
        heard, self.heard = self.heard, {}
        if not latest and not rollups and not heard:
            return 0
        try:
            await self._write(latest, rollups, heard)
        except Exception:
            # Put back what was not written (newer samples win) so the next flush retries it.
            for k, v in latest.items():
                self.latest.setdefault(k, v)
            for k, agg in rollups.items():
                if k in self.rollups:
                    agg.merge(self.rollups[k])
                self.rollups[k] = agg
            for k, v in heard.items():
                self.heard.setdefault(k, v)
            self._cap_rollups()
            raise
        return len(latest)

    async def _write(self, latest: dict, rollups: dict, heard: dict) -> None:
        writer = self._writer()
        if writer is None:
            # Its own thread, not the shared sync thread: a flush must not hold up hellos and results.
            await database_sync_to_async(_write, thread_sensitive=False)(latest, rollups, heard)
        else:  # the thread only pickles the flush and waits on the pipe: the writing holds another GIL
            await asyncio.get_running_loop().run_in_executor(None, writer.write, latest, rollups, heard)

    def _writer(self) -> WriterProcess | None:
        if self.process is None:
            in_memory = connections["default"].vendor == "sqlite" and connections["default"].is_in_memory_db()
            self.process = settings.FLEET["METRICS_WRITER_PROCESS"] and not in_memory
        if self.process and self.writer is None:
            self.writer = WriterProcess(database=dict(connections["default"].settings_dict),
                                        timeout=settings.FLEET["METRICS_WRITE_TIMEOUT_SECONDS"])
        return self.writer if self.process else None

    def close(self) -> None:
        """At shutdown (scheduler/gateway/lifespan.py): write what is buffered, then end the writer process (a
        later flush would start another). Blocks: call it from a thread."""
        latest, rollups, heard = self.latest, self.rollups, self.heard
        self.latest, self.rollups, self.heard = {}, {}, {}
        writer = self._writer()
        if writer is None:
            return
        try:
            if latest or rollups or heard:
                writer.write(latest, rollups, heard)
        except Exception:
            log.exception("the last metrics flush failed at shutdown: %d GPU-minute rollups not written",
                          len(rollups))
        finally:
            writer.close()

    def _cap_rollups(self) -> None:
        """Drop the oldest GPU-minutes past the cap (only after a failed flush: not on the hot path)."""
        excess = len(self.rollups) - settings.FLEET["METRICS_BUFFER_MAX_ROLLUPS"]
        if excess <= 0:
            return
        for key in heapq.nsmallest(excess, self.rollups, key=lambda k: k[1]):
            del self.rollups[key]
        self.rollups_dropped += excess
        log.warning("metrics buffer full while the database is unreachable: dropped the %d oldest GPU-minute "
                    "rollups (%d dropped since start); kept %d", excess, self.rollups_dropped, len(self.rollups))


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=dt_timezone.utc)


LATEST_COLUMNS = ("gpu_id", "at", "util", "mem_used_mib", "mem_total_mib", "temp_c", "power_w", "sm_clock_mhz",
                  "ecc_sbe", "ecc_dbe")
ROLLUP_COLUMNS = ("gpu_id", "minute", "samples") + tuple(
    f"{col}_{k}" for _, col in ROLLUP_FIELDS for k in ("min", "avg", "max"))


def _replace(c: str, t: str, qn) -> str:
    return f"{qn(c)} = excluded.{qn(c)}"


def _merge(c: str, t: str, qn) -> str:
    """Merge a rollup column with what the row holds: samples add up, min/max keep the extreme, avg is
    weighted by samples; a null on either side (no reading) yields the other side. Portable SQL: SQLite's
    min()/max() return null if any argument is null and it has no LEAST/GREATEST."""
    old, new = f"{qn(t)}.{qn(c)}", f"excluded.{qn(c)}"
    if c == "samples":
        return f"{qn(c)} = {old} + {new}"
    if c.endswith("_avg"):
        n_old, n_new = f"{qn(t)}.{qn('samples')}", f"excluded.{qn('samples')}"
        combined = f"({old} * {n_old} + {new} * {n_new}) / ({n_old} + {n_new})"
    else:
        combined = f"CASE WHEN {new} {'<' if c.endswith('_min') else '>'} {old} THEN {new} ELSE {old} END"
    return f"{qn(c)} = CASE WHEN {old} IS NULL THEN {new} WHEN {new} IS NULL THEN {old} ELSE {combined} END"


def _upsert_sql(table: str, columns: tuple[str, ...], key: tuple[str, ...], qn, how=_replace) -> str:
    """INSERT ... ON CONFLICT (key) DO UPDATE: the same text on PostgreSQL and SQLite (3.24+)."""
    updates = ", ".join(how(c, table, qn) for c in columns if c not in key)
    return (f"INSERT INTO {qn(table)} ({', '.join(qn(c) for c in columns)}) "
            f"VALUES ({', '.join(['%s'] * len(columns))}) "
            f"ON CONFLICT ({', '.join(qn(c) for c in key)}) DO UPDATE SET {updates}")


def _write(latest: dict, rollups: dict, heard: dict) -> None:
    """Write one flush: upsert latest samples and rollups in one transaction, then stamp heartbeats.

    Plain executemany instead of the ORM's bulk_create: at thousands of rows per flush the ORM spends
    most of the time compiling SQL per row, holding the GIL the websocket loop needs.
    """
    from django.db import connection, transaction

    from scheduler.models import Gpu, GpuMetricLatest, GpuMetricRollup
    from scheduler.services.nodes import nodes_heartbeat

    close_old_connections()
    qn, dt = connection.ops.quote_name, connection.ops.adapt_datetimefield_value
    with transaction.atomic():
        # GPUs may have been deleted since their samples arrived: write only those that still exist. On PostgreSQL
        # their rows are key-share locked here, all at once in id order, and the rows below are written in that
        # order: an insert's foreign-key check takes the same lock row by row, and taken in the samples' order it
        # closed lock cycles with orders and agents' replies, which lock GPUs in id order (a deadlock aborted one).
        alive = _gpus_locked(Gpu, set(latest) | {k[0] for k in rollups}, connection)
        latest_rows = [(gid, dt(_dt(ts)), s.get("util"), s.get("mem_used_mib"), s.get("mem_total_mib"),
                        s.get("temp_c"), s.get("power_w"), s.get("sm_clock_mhz"), s.get("ecc_sbe"), s.get("ecc_dbe"))
                       for gid, (ts, s) in sorted(latest.items()) if gid in alive]
        rollup_rows = []
        for (gid, minute), agg in sorted(rollups.items(), key=lambda item: item[0]):
            if gid not in alive:
                continue
            row = [gid, dt(_dt(minute)), agg.n]
            for i in range(len(ROLLUP_FIELDS)):
                seen = agg.counts[i] > 0
                row += [agg.mins[i] if seen else None, agg.sums[i] / agg.counts[i] if seen else None,
                        agg.maxs[i] if seen else None]
            rollup_rows.append(row)
        with connection.cursor() as cursor:
            if latest_rows:
                cursor.executemany(_upsert_sql(GpuMetricLatest._meta.db_table, LATEST_COLUMNS, ("gpu_id",), qn),
                                   latest_rows)
            if rollup_rows:
                cursor.executemany(_upsert_sql(GpuMetricRollup._meta.db_table, ROLLUP_COLUMNS,
                                               ("gpu_id", "minute"), qn, how=_merge), rollup_rows)
    if heard:  # its own transaction: a node's row is not held while the samples are written
        nodes_heartbeat(node_ids=sorted(heard), at=_dt(max(heard.values())))


def _gpus_locked(Gpu, ids: set, connection) -> set:
    """Which of `ids` are GPUs that exist, their rows key-share locked in id order on PostgreSQL (SQLite locks
    the whole database per write transaction)."""
    if connection.vendor != "postgresql":
        return set(Gpu.objects.filter(pk__in=ids).values_list("pk", flat=True))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {connection.ops.quote_name(Gpu._meta.db_table)} WHERE id = ANY(%s) "
                       "ORDER BY id FOR KEY SHARE", [sorted(ids)])
        return {row[0] for row in cursor.fetchall()}


INGEST = MetricsIngest()
