"""A `redis-server` of a test's own on a free loopback port: for tests that stop Redis, or that count what the
server sees (the shared server of REDIS_URL is never stopped, and the other shard of `make test` uses it too)."""
from __future__ import annotations

import contextlib
import shutil
import subprocess

import pytest

from tests.e2e.livestack import free_port, wait_until

needs_redis_server = pytest.mark.skipif(shutil.which("redis-server") is None,
                                        reason="needs redis-server (CI installs it)")


@contextlib.contextmanager
def redis_server(port: int | None = None):
    """Run redis-server on `port` (a free one when None) until the block ends; yields its redis:// URL."""
    port = port or free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                          text=True).stdout.strip() == "PONG", timeout=20, what="redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
