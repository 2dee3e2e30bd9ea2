"""A web process on PostgreSQL takes its connections from a small pool: a burst larger than the pool queues for a
connection, and one that waits past DB_POOL_TIMEOUT gets a 503 in the API's error shape, never a 500; every
connection goes back to the pool afterwards."""
from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from urllib.parse import urlparse

import psycopg
import pytest

from tests.e2e.livestack import LiveStack, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]

POOL_MAX = 2
BURST = 12


@pytest.fixture
def pool_database():
    """A database of its own for the web process (the test's is inside pytest-django's transaction)."""
    url = urlparse(os.environ["DATABASE_URL"])
    name = f"{url.path.lstrip('/')}_pool_{os.getpid()}"
    admin = url._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield url._replace(path=f"/{name}").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _web_connections(conn, database: str) -> list[tuple[str, str | None]]:
    return conn.execute("SELECT state, wait_event_type FROM pg_stat_activity WHERE datname = %s AND pid <> "
                        "pg_backend_pid()", [database]).fetchall()


def _get(stack: LiveStack, path: str) -> tuple[int, dict, str | None]:
    """The status, body and Retry-After of an API call as the seeded user."""
    req = urllib.request.Request(stack.url + path, headers={"Authorization": f"Bearer {stack.seed['api_key']}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, body, headers = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as err:
        status, body, headers = err.code, err.read(), err.headers
    try:
        return status, json.loads(body), headers.get("Retry-After")
    except ValueError:
        return status, {"not_json": body[:200].decode(errors="replace")}, headers.get("Retry-After")


def test_a_burst_beyond_the_pool_gets_503s_with_retry_after_and_every_connection_comes_back(
        tmp_path, pool_database):
    database = urlparse(pool_database).path.lstrip("/")
    stack = LiveStack(tmp_path, nodes=[], celery=False, start_agents=False,
                      env={"DATABASE_URL": pool_database, "DB_POOL_MIN": "1", "DB_POOL_MAX": str(POOL_MAX),
                           "DB_POOL_TIMEOUT": "1", "API_THROTTLE_USER": "100000/min"}).start()
    try:
        assert _get(stack, "/api/v1/nodes/")[0] == 200
        answers: list[tuple[int, dict, str | None]] = []

        def call():
            answers.append(_get(stack, "/api/v1/nodes/"))

        with psycopg.connect(pool_database) as locker:
            # Every API request authenticates by reading the API key table: while it is locked, the requests that
            # got a pooled connection hold it waiting, and the rest wait for the pool.
            locker.execute("LOCK TABLE marketplace_apikey IN ACCESS EXCLUSIVE MODE")
            threads = [threading.Thread(target=call) for _ in range(BURST)]
            for t in threads:
                t.start()
            with psycopg.connect(pool_database, autocommit=True) as watcher:
                wait_until(lambda: len(answers) + sum(w == "Lock" for _, w in _web_connections(watcher, database))
                           >= BURST, timeout=60, what="the burst to be answered or waiting on the lock")
            locker.commit()
        for t in threads:
            t.join(30)

        statuses = sorted(status for status, _, _ in answers)
        assert len(statuses) == BURST and set(statuses) <= {200, 503}, statuses
        assert 503 in statuses and 200 in statuses  # exhausted, and those holding a connection finished
        for status, body, retry_after in answers:
            if status == 503:
                assert body["error"]["code"] == "service_unavailable" and "retry" in body["error"]["message"]
                assert retry_after is not None and int(retry_after) > 0

        # Back to the pool: as many requests again, one after another, each gets a connection; the server holds
        # no more than the pool's size.
        assert [_get(stack, "/api/v1/nodes/")[0] for _ in range(BURST)] == [200] * BURST
        # The last answer reaches the client before its connection goes back to the pool (and its transaction
        # ends): wait for that, then every connection is idle and there are no more than the pool's.
        with psycopg.connect(pool_database, autocommit=True) as watcher:
            wait_until(lambda: all(state == "idle" for state, _ in _web_connections(watcher, database)),
                       timeout=15, what="the web process's connections to go back to the pool")
            held = _web_connections(watcher, database)
        assert len(held) <= POOL_MAX and all(state == "idle" for state, _ in held), held
    finally:
        stack.stop()
