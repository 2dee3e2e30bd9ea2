"""The production layout on loopback, for scale-out and fault tests and the soak bench: PostgreSQL + Redis with
several processes — N uvicorn web processes on N ports, M Celery workers, one beat, and real agent processes
each connected to a chosen web process.

The cluster owns its engines: a fresh database on the PostgreSQL server of $DATABASE_URL (a unique name,
dropped at stop) and its own `redis-server` on a free loopback port (never the shared one: fault tests shut it
down and start it again on the same port with `redis_stop()` / `redis_start()`). Every child gets DATABASE_URL
and REDIS_URL pointing at them.

    cluster = Cluster(tmp_path, nodes=[("n1", "l4:8")], webs=2, workers=2, agent_web={"n1": 1}).start()
    cluster.api("GET", "/api/v1/nodes/", web=1)
    cluster.kill("worker0"); cluster.restart("worker0")
    ...
    cluster.stop()

Without PostgreSQL or redis-server the tests that use it are skipped with the reason, except where
GPUMARKET_REQUIRE_ENGINE=1 (CI), where that is a failure (tests.enginefix.unavailable).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlparse, urlunparse

from tests.e2e.livestack import LiveStack, free_port, wait_until

# Beat periods short enough that a test sees metering, the queue, lease ends and offline nodes within seconds.
FAST_BEAT = {
    "FLEET_HEARTBEAT_TIMEOUT": "5", "FLEET_OFFLINE_CHECK": "1", "FLEET_METRICS_FLUSH": "0.5",
    "MARKET_METER_SECONDS": "0.5", "MARKET_LEASE_TICK_SECONDS": "0.5", "MARKET_QUEUE_SECONDS": "0.5",
    "MARKET_SPOT_NOTICE_SECONDS": "2", "MARKET_PREEMPT_NOTICE_SECONDS": "2",
}


def engines_missing() -> str | None:
    """Why this machine cannot run a cluster, or None."""
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        return "the cluster needs PostgreSQL: set DATABASE_URL=postgres://... (CI does)"
    if shutil.which("redis-server") is None:
        return "the cluster starts its own Redis and redis-server is not installed (apt-get install redis-server)"
    return None


def require_engines() -> None:
    """Skip the calling test (fail it under GPUMARKET_REQUIRE_ENGINE=1) when the cluster cannot run here."""
    reason = engines_missing()
    if reason:
        from tests.enginefix import unavailable

        unavailable(reason)


def _server_url(url: str, database: str) -> str:
    parsed = urlparse(url)
    return urlunparse(parsed._replace(path="/" + database, query=""))


class Cluster(LiveStack):
    """`webs` uvicorn processes (web0, web1, ...), `workers` Celery workers (worker0, ...) of `pool` with
    `concurrency` each, one beat, and one agent per node (agent-NAME) connected to web `agent_web[NAME]`
    (default: the nodes spread round-robin over the webs)."""

    def __init__(self, tmp: Path, *, nodes: list[tuple[str, str]], webs: int = 2, workers: int = 2,
                 pool: str = "prefork", concurrency: int = 2, agent_web: dict[str, int] | None = None,
                 env: dict | None = None, fast: bool = True, **kwargs):
        super().__init__(tmp, nodes=nodes, env={**(FAST_BEAT if fast else {}), **(env or {})}, **kwargs)
        self.web_ports = [free_port() for _ in range(webs)]
        self.port, self.url = self.web_ports[0], self.web_url(0)
        self.workers, self.pool, self.concurrency = workers, pool, concurrency
        self.agent_web = {name: i % webs for i, (name, _) in enumerate(nodes)} | (agent_web or {})
        self.redis_port = free_port()
        self.database = f"gpm_cluster_{uuid.uuid4().hex[:12]}"
        self.admin_url = _server_url(os.environ.get("DATABASE_URL", ""), "postgres")
        self.env.update(DATABASE_URL=_server_url(os.environ.get("DATABASE_URL", ""), self.database),
                        REDIS_URL=f"redis://127.0.0.1:{self.redis_port}/0")
        self._database_created = False

    # --- engines --------------------------------------------------------------------------------------------

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def redis_start(self) -> None:
        """Start the cluster's redis-server (again) on its port; returns once it answers."""
        self._spawn("redis", ["--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(self.tmp), "--protected-mode", "yes"],
                    program=shutil.which("redis-server"))
        wait_until(lambda: self.procs["redis"].poll() is not None or self._redis_ping(), timeout=20,
                   what="redis-server to answer")
        if self.procs["redis"].poll() is not None:
            raise RuntimeError(f"redis-server exited: {(self.tmp / 'redis.log').read_text()[-1500:]}")

    def redis_stop(self) -> None:
        """Shut the cluster's Redis down as an operator would (`redis-cli shutdown nosave`); its data goes."""
        subprocess.run([shutil.which("redis-cli") or "redis-cli", "-p", str(self.redis_port), "shutdown", "nosave"],
                       capture_output=True, timeout=10)
        self.procs["redis"].wait(timeout=10)

    def _redis_ping(self) -> bool:
        out = subprocess.run([shutil.which("redis-cli") or "redis-cli", "-p", str(self.redis_port), "ping"],
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() == "PONG"

    # --- processes ------------------------------------------------------------------------------------------

    @property
    def web_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.web_ports]

    def agent_server(self, node: dict) -> str:
        """The agent's --server: its own web process first, then the others (it fails over to the next when one
        goes away, as a production agent given every web process's URL does)."""
        own = self.agent_web[node["name"]]
        order = [own] + [i for i in range(len(self.web_ports)) if i != own]
        return ",".join(f"ws://127.0.0.1:{self.web_ports[i]}/ws/agent/" for i in order)

    def start(self) -> "Cluster":
        self._admin(f'CREATE DATABASE "{self.database}"')
        self._database_created = True
        self.redis_start()
        return super().start()

    def _start_processes(self) -> None:
        for i, port in enumerate(self.web_ports):
            self._spawn(f"web{i}", ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                                    str(port), "--ws", "config.wsprotocol:WebSocketProtocol", "--log-level", "warning",
                                    *self.web_args])
        for i, port in enumerate(self.web_ports):
            wait_until(lambda: self._port_open_at(port), timeout=60, what=f"web{i} on port {port}")
        for i in range(self.workers):
            self._spawn(f"worker{i}", ["-m", "celery", "-A", "config", "worker", "--pool", self.pool,
                                       "--concurrency", str(self.concurrency), "--hostname", f"worker{i}@%h",
                                       "--without-mingle", "--without-gossip", "--loglevel", "WARNING"])
        self._spawn("beat", ["-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING",
                             "--schedule", str(self.tmp / "beat-schedule")])
        for node in self.seed["nodes"] if self.start_agents else ():
            self.start_agent(node)

    def restart(self, name: str) -> subprocess.Popen:
        if name == "redis":
            if self.procs["redis"].poll() is None:
                self.redis_stop()
            self.redis_start()
            return self.procs["redis"]
        proc = super().restart(name)
        if name.startswith("web"):
            port = self.web_ports[int(name[3:])]
            wait_until(lambda: self._port_open_at(port), timeout=60, what=f"{name} on port {port}")
        return proc

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self._database_created:
                # FORCE: a connection a killed process left half-open must not keep the database alive.
                self._admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
                self._database_created = False


def running_cluster(tmp: Path, **kwargs):
    """A started Cluster for a fixture to `yield from` (skips, or fails on CI, when it cannot run here): the logs of
    its processes are printed when starting fails (tests/e2e/conftest.py adds them to a failed test's report), and
    everything is stopped and dropped at the end."""
    require_engines()
    cluster = Cluster(tmp, **kwargs)
    try:
        yield cluster.start()
    except Exception:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        cluster.stop()

