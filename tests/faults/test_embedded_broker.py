"""The embedded broker (config/broker.py) loses nothing: producers in several processes, a prefork worker,
and a worker killed with tasks in hand. Real processes on the project's embedded-default settings."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.livestack import wait_until

ROOT = Path(__file__).resolve().parents[2]
PRODUCE = """
import sys
from tests.faults.brokerapp import record
start, count, sleep = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
for n in range(start, start + count):
    record.delay(n, sleep)
"""


@pytest.fixture
def broker_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings.dev", DJANGO_DEBUG="1", GPUMARKET_VAR_DIR=str(tmp_path),
               PYTHONUNBUFFERED="1")
    with sqlite3.connect(tmp_path / "runs.sqlite3") as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE runs (n INTEGER, pid INTEGER)")
    return env


def _produce(env, start: int, count: int, sleep: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PRODUCE, str(start), str(count), str(sleep)], cwd=ROOT, env=env)


def _worker(env, tmp: Path, name: str) -> subprocess.Popen:
    with open(tmp / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "celery", "-A", "tests.faults.brokerapp", "worker", "--pool",
                                 "prefork", "--concurrency", "2", "--without-mingle", "--without-gossip",
                                 "--loglevel", "WARNING", "-n", f"{name}@%h"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _runs(tmp: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(tmp / "runs.sqlite3", timeout=60) as db:
        return db.execute("SELECT n, COUNT(*) FROM runs GROUP BY n").fetchall()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a warm shutdown slowed by a busy machine: not what is tested here
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.mark.timeout(900)
def test_twenty_thousand_tasks_from_two_producers_each_run_exactly_once(broker_env, tmp_path):
    worker = _worker(broker_env, tmp_path, "soak")
    try:
        producers = [_produce(broker_env, 0, 10_000), _produce(broker_env, 10_000, 10_000)]
        for p in producers:
            assert p.wait(timeout=600) == 0
        wait_until(lambda: len(_runs(tmp_path)) >= 20_000 or worker.poll() is not None, timeout=900, interval=1,
                   what="20,000 tasks run")
        assert worker.poll() is None, (tmp_path / "soak.log").read_text()[-3000:]
        time.sleep(1)  # a duplicate would show up now
        runs = _runs(tmp_path)
        assert sorted(n for n, _ in runs) == list(range(20_000))
        assert [n for n, times in runs if times != 1] == []
        assert list((tmp_path / "celery" / "queue").iterdir()) == []
    finally:
        _stop(worker)
    log = (tmp_path / "soak.log").read_text()
    assert "Unrecoverable" not in log and "Traceback" not in log, log[-3000:]


def test_a_worker_killed_with_tasks_in_hand_loses_none_of_them(broker_env, tmp_path):
    """kill -9 while both pool processes run a task and more wait: the next worker finds the dead one's claims
    (its lock is free) and runs them; every task ran, none was lost (a task killed mid-run runs again)."""
    producer = _produce(broker_env, 0, 40, sleep=0.2)
    assert producer.wait(timeout=120) == 0
    first = _worker(broker_env, tmp_path, "first")
    wait_until(lambda: len(_runs(tmp_path)) >= 6, timeout=120, interval=0.05, what="a few tasks run")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    claimed = [p for p in (tmp_path / "celery" / "claimed").rglob("*.msg")]
    assert claimed, "the killed worker held no claims: the test did not kill it with tasks in hand"
    second = _worker(broker_env, tmp_path, "second")
    try:
        wait_until(lambda: len(_runs(tmp_path)) >= 40, timeout=180, interval=0.5, what="all 40 tasks run")
        runs = dict(_runs(tmp_path))
        assert sorted(runs) == list(range(40))
        # Only what the killed worker was running may have run twice.
        assert sum(times - 1 for times in runs.values()) <= 2
    finally:
        _stop(second)
    assert not list((tmp_path / "celery" / "claimed").rglob("*.msg"))


def test_a_consumer_taking_its_lock_is_not_taken_for_a_dead_one(tmp_path):
    """A consumer creates its lock under a hidden name and locks it before renaming it: a recoverer that ran in
    between must leave that file alone (it used to flock it, find it free and delete it under the consumer)."""
    from kombu import Connection

    from config.broker import broker_folders

    with Connection("filesystem://", transport="config.broker:Transport",
                    transport_options=broker_folders(tmp_path / "celery")) as conn:
        channel = conn.channel()
        starting = tmp_path / "celery" / "claimed" / ".4242-abcdef.lock"
        starting.write_text("")  # made, not yet locked: the instant between open() and flock()
        dead = tmp_path / "celery" / "claimed" / "4343-fedcba"
        dead.mkdir()
        (dead.parent / "4343-fedcba.lock").write_text("")
        (dead / "0001_x.celery.msg").write_text("{}")
        assert channel._recover_dead_claims() == 1  # the dead consumer's claim goes back to the queue
        assert starting.exists()
        assert [p.name for p in (tmp_path / "celery" / "queue").iterdir()] == ["0001_x.celery.msg"]


def test_a_backlog_is_listed_once_for_every_queue_not_once_per_message(tmp_path, monkeypatch):
    """A worker polls its remote-control queue (nearly always empty) beside the task queue; each poll of it used to
    list the whole queue folder, so with 20,000 tasks waiting every task cost a read of the backlog (~110 tasks/s
    instead of ~800 here). One listing now serves every queue, and a queue found empty is listed again only after
    RESCAN_SECONDS: a message sent later still arrives."""
    from kombu import Connection
    from kombu.transport import filesystem

    from config import broker

    monkeypatch.setattr(broker, "RESCAN_SECONDS", 3600.0, raising=False)
    with Connection("filesystem://", transport="config.broker:Transport",
                    transport_options=broker.broker_folders(tmp_path / "celery")) as conn:
        channel = conn.channel()
        for n in range(300):
            channel._put("celery", {"n": n, "properties": {"delivery_tag": f"t{n}"}})
        listings = []
        listdir = os.listdir
        monkeypatch.setattr(broker.os, "listdir", lambda path: listings.append(path) or listdir(path))
        got = []
        for _ in range(300):
            with pytest.raises(filesystem.Empty):
                channel._get("worker@host.celery.pidbox")
            got.append(channel._get("celery")["n"])
        assert got == list(range(300))  # oldest first, each once
        assert len(listings) == 1
        channel._put("celery", {"n": 300, "properties": {"delivery_tag": "t300"}})
        with pytest.raises(filesystem.Empty):
            channel._get("celery")  # found empty a moment ago: not listed again yet
        monkeypatch.setattr(broker, "RESCAN_SECONDS", 0.0)
        assert channel._get("celery")["n"] == 300
        assert len(listings) == 2
