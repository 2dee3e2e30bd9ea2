"""The metrics writer process: it writes each flush, outlives a failed one, is started again when killed,
leaves the web process's memory bounded while the database is away, and nothing buffered is lost when
the web server shuts down cleanly. Real processes, on the database the tests run on (on SQLite, a file
copy of the in-memory test database: another process cannot open that)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone

import pytest
from django.db import connection

from nodeagent import protocol
from scheduler.gateway.ingest import MetricsIngest
from scheduler.gateway.writer import WriteFailed, WriterGone, WriterProcess
from scheduler.services import nodes as node_services
from tests.agentframes import hello_from, metrics_from, sim_backend
from tests.e2e.livestack import ROOT, LiveStack, free_port, wait_until
from tests.factories import node_with_token

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = 1_800_000_000 // 60 * 60
SAMPLE = {"util": 10.0, "mem_used_mib": 1000.0, "mem_total_mib": 81920.0, "temp_c": 40.0, "power_w": 100.0}


class WriterDb:
    """The test database as another process reaches it, read and locked from here with plain SQL."""

    def __init__(self, tmp_path):
        connection.ensure_connection()
        self.settings = dict(connection.settings_dict)
        self.sqlite = connection.vendor == "sqlite"
        if self.sqlite:
            path = tmp_path / "db.sqlite3"
            with sqlite3.connect(path) as copy:
                connection.connection.backup(copy)
            self.settings.update(NAME=str(path), TEST={})

    def url(self) -> str:
        s = self.settings
        if self.sqlite:
            return f"sqlite:///{s['NAME']}"
        return f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"

    def _connect(self):
        if self.sqlite:
            return sqlite3.connect(self.settings["NAME"], isolation_level=None, timeout=30)
        import psycopg

        s = self.settings
        return psycopg.connect(dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"],
                               host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, autocommit=True)

    def one(self, sql: str):
        con = self._connect()
        try:
            return con.execute(sql).fetchone()[0]
        finally:
            con.close()

    def samples(self, gpu_id: int) -> int:
        return self.one(f"select coalesce(sum(samples), 0) from scheduler_gpumetricrollup where gpu_id = {gpu_id}")

    def writer(self, *, lock_wait: float = 30.0, timeout: float = 60.0) -> WriterProcess:
        """A writer process on this database that gives up on a locked table after `lock_wait` seconds."""
        options = ({"timeout": lock_wait} if self.sqlite
                   else {**self.settings.get("OPTIONS", {}), "options": f"-c lock_timeout={int(lock_wait * 1000)}"})
        return WriterProcess(database={**self.settings, "OPTIONS": options}, timeout=timeout)

    @contextlib.contextmanager
    def locked(self):
        """The rollup table locked by another session, as a database that does not answer writes."""
        con = self._connect()
        try:
            if self.sqlite:
                con.execute("BEGIN EXCLUSIVE")
            else:
                con.execute("BEGIN")
                con.execute("LOCK TABLE scheduler_gpumetricrollup IN ACCESS EXCLUSIVE MODE")
            yield
            con.execute("ROLLBACK")
        finally:
            con.close()


@pytest.fixture
def gpu():
    node, token = node_with_token()
    node_services.node_hello(node_id=node.pk, frame=hello_from(sim_backend("h100-80gb:1", hostname="writer")))
    gpu = node.gpus.get()
    gpu.token = token
    return gpu


@pytest.fixture
def db(gpu, tmp_path):
    return WriterDb(tmp_path)


@pytest.fixture
def ingest():
    buf = MetricsIngest(process=True)
    yield buf
    if buf.writer is not None:
        buf.writer.close()


def add(buf, gpu, second: int, temp: float = 40.0) -> None:
    buf.add(node_id=gpu.node_id, ts=MINUTE + second, samples=[(gpu.pk, {**SAMPLE, "temp_c": temp})])


async def test_the_writer_process_writes_latest_values_merged_rollups_and_heartbeats(gpu, db, ingest):
    ingest.writer = db.writer()
    add(ingest, gpu, 1, 40)
    add(ingest, gpu, 2, 60)
    assert await ingest.flush() == 1
    pid = ingest.writer.pid
    assert pid is not None and pid != os.getpid()
    add(ingest, gpu, 3, 50)
    await ingest.flush()
    assert db.samples(gpu.pk) == 3
    assert db.one(f"select temp_max from scheduler_gpumetricrollup where gpu_id = {gpu.pk}") == 60
    assert db.one(f"select temp_c from scheduler_gpumetriclatest where gpu_id = {gpu.pk}") == 50
    heartbeat = db.one("select n.last_heartbeat from scheduler_node n join scheduler_gpu g on g.node_id = n.id "
                       f"where g.id = {gpu.pk}")
    assert str(heartbeat)[:19] == datetime.fromtimestamp(MINUTE + 3, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    assert ingest.writer.pid == pid and ingest.writer.starts == 1  # one process for every flush


async def test_the_writer_process_survives_a_failed_flush_and_the_next_flush_writes_what_failed(gpu, db, ingest):
    ingest.writer = db.writer(lock_wait=0.3)
    add(ingest, gpu, 1, 40)
    with db.locked():
        with pytest.raises(WriteFailed):
            await ingest.flush()
    pid = ingest.writer.pid
    assert pid is not None and db.samples(gpu.pk) == 0
    add(ingest, gpu, 2, 60)
    await ingest.flush()
    assert db.samples(gpu.pk) == 2  # the failed flush's sample and the new one, each once
    assert ingest.writer.pid == pid and ingest.writer.starts == 1


async def test_a_writer_process_killed_during_a_flush_is_started_again_and_the_flush_is_written_once(
        gpu, db, ingest):
    ingest.writer = db.writer()
    add(ingest, gpu, 1, 40)
    await ingest.flush()
    first = ingest.writer.pid
    add(ingest, gpu, 2, 50)
    with db.locked():  # the writer cannot commit: it is killed while it waits
        flushing = asyncio.ensure_future(ingest.flush())
        await asyncio.to_thread(wait_until, lambda: ingest.writer.in_flight, timeout=30, what="a flush on the pipe")
        os.kill(first, signal.SIGKILL)
        with pytest.raises(WriterGone):
            await flushing
    add(ingest, gpu, 3, 60)
    await ingest.flush()
    assert ingest.writer.starts == 2 and ingest.writer.pid not in (None, first)
    assert db.samples(gpu.pk) == 3
    # Killed between flushes: the next flush starts another writer and loses nothing either.
    os.kill(ingest.writer.pid, signal.SIGKILL)
    await asyncio.to_thread(wait_until, lambda: ingest.writer.pid is None, timeout=30, what="the writer's exit")
    add(ingest, gpu, 4, 70)
    await ingest.flush()
    assert ingest.writer.starts == 3 and db.samples(gpu.pk) == 4


async def test_a_flush_the_writer_does_not_answer_in_time_fails_and_the_next_writer_writes_it(gpu, db, ingest):
    ingest.writer = db.writer(lock_wait=120)  # a database that hangs rather than refuses
    add(ingest, gpu, 1, 40)
    await ingest.flush()  # the writer started (on a loaded machine that alone can take over a second)
    add(ingest, gpu, 2, 50)
    ingest.writer.timeout = 1
    with db.locked():
        with pytest.raises(WriteFailed, match="did not answer within 1 s"):
            await ingest.flush()
        assert ingest.writer.pid is None  # the hung writer was ended
    assert sum(agg.n for agg in ingest.rollups.values()) == 1  # kept for the next flush (and under the cap)
    ingest.writer.timeout = 60
    await ingest.flush()
    assert ingest.writer.starts == 2 and db.samples(gpu.pk) == 2


async def test_memory_stays_bounded_while_the_database_is_away_and_one_writer_process_waits_it_out(
        gpu, db, ingest, settings, tmp_path):
    settings.FLEET = {**settings.FLEET, "METRICS_BUFFER_MAX_ROLLUPS": 3}
    unreachable = {**db.settings, "ENGINE": "django.db.backends.sqlite3", "OPTIONS": {},
                   "NAME": str(tmp_path / "no-such-folder" / "db.sqlite3")}
    ingest.writer = WriterProcess(database=unreachable)
    for minute in range(6):
        add(ingest, gpu, 60 * minute + 1, 40 + minute)
        with pytest.raises(WriteFailed, match="unable to open database file"):
            await ingest.flush()
        assert len(ingest.rollups) <= 3
    assert sorted(m for _, m in ingest.rollups) == [MINUTE + 180, MINUTE + 240, MINUTE + 300]
    assert ingest.rollups_dropped == 3
    assert ingest.writer.starts == 1 and ingest.writer.pid is not None  # the writer holds nothing between flushes


async def test_a_clean_shutdown_of_the_web_server_writes_what_it_had_buffered(gpu, db, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    # No periodic flush during the test: what reaches the database is written at shutdown.
    env.update(DATABASE_URL=db.url(), DJANGO_SETTINGS_MODULE="config.settings.dev", GPUMARKET_VAR_DIR=str(tmp_path),
               FLEET_METRICS_FLUSH="60", LOG_LEVEL="WARNING")
    log = open(tmp_path / "web.log", "wb")
    web = subprocess.Popen([sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
                            "--port", str(port), "--ws", "config.wsprotocol:WebSocketProtocol", "--log-level", "warning"],
                           cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        await asyncio.to_thread(wait_until, lambda: LiveStack._port_open_at(port), timeout=60, what="the web server")
        import websockets

        backend = sim_backend("h100-80gb:1", hostname="writer")
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws/agent/",
                                      additional_headers={"Authorization": f"Bearer {gpu.token}"}) as ws:
            await ws.send(protocol.encode(hello_from(backend)))
            assert json.loads(await ws.recv())["type"] == "welcome"
            for _ in range(5):
                await ws.send(protocol.encode(metrics_from(backend)))
            await ws.send("{")  # frames are handled in order: the answer to this one comes after the five
            assert json.loads(await ws.recv())["type"] == "error"
            assert db.samples(gpu.pk) == 0
        os.killpg(web.pid, signal.SIGTERM)  # what a service manager does: the writer gets it too
        # uvicorn shuts down gracefully, then re-raises the signal: its exit status is -SIGTERM
        assert await asyncio.to_thread(web.wait, 30) in (0, -signal.SIGTERM)
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGKILL)
        log.close()
    assert db.samples(gpu.pk) == 5, (tmp_path / "web.log").read_text()
    assert db.one(f"select count(*) from scheduler_gpumetriclatest where gpu_id = {gpu.pk}") == 1

