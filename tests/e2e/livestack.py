"""A live stack for end-to-end tests and benchmarks: the real ASGI server, Celery worker and beat, and
real agent processes, on loopback, with their own SQLite database in a temporary folder."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SEED = r"""
import json
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.auth import SESSION_KEY, BACKEND_SESSION_KEY, HASH_SESSION_KEY
from marketplace.products.apikeys import api_key_create
from scheduler.services.nodes import node_register
spec = json.loads(%r)
user = get_user_model().objects.create_user("e2e-provider", password="e2e-password")
nodes = []
for name, simulate in spec:
    node, token = node_register(provider=user, name=name)
    nodes.append({"id": str(node.pk), "name": name, "token": token, "simulate": simulate})
_, key = api_key_create(user=user, name="e2e")
s = SessionStore()
s[SESSION_KEY] = str(user.pk); s[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
s[HASH_SESSION_KEY] = user.get_session_auth_hash(); s.create()
print("SEED" + json.dumps({"nodes": nodes, "api_key": key, "session": s.session_key}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, *, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll `predicate` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


class LiveStack:
    def __init__(self, tmp: Path, *, nodes: list[tuple[str, str]], env: dict | None = None,
                 celery: bool = True, agent_interval: float = 1.0,
                 start_agents: bool = True, web_args: tuple[str, ...] = (), agent_args: tuple[str, ...] = ()):
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.celery = celery
        self.agent_interval = agent_interval
        self.start_agents = start_agents
        self.web_args = tuple(web_args)
        self.agent_args = tuple(agent_args)  # e.g. the container runtime: --runtime docker --engine-url ...
        base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        self.env = {**base, "DJANGO_SETTINGS_MODULE": "config.settings.dev", "DJANGO_DEBUG": "1",
                    "GPUMARKET_VAR_DIR": str(tmp), "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "WARNING",
                    **(env or {})}
        self.spec = nodes

    def _run(self, *argv: str) -> str:
        out = subprocess.run([sys.executable, *argv], cwd=ROOT, env=self.env, capture_output=True, text=True,
                             timeout=180)
        if out.returncode != 0:
            raise RuntimeError(f"{argv} failed: {out.stderr[-2000:]}")
        return out.stdout

    def _spawn(self, name: str, argv: list[str], env: dict | None = None, *,
               program: str = sys.executable) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")
        proc = subprocess.Popen([program, *argv], cwd=ROOT, env={**self.env, **(env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def start(self) -> "LiveStack":
        self._run("manage.py", "migrate", "-v", "0")
        out = self._run("manage.py", "shell", "-c", SEED % json.dumps(self.spec))
        self.seed = json.loads(out[out.index("SEED") + 4:])
        self._spawn("web", ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                            str(self.port), "--ws", "config.wsprotocol:WebSocketProtocol", "--log-level", "warning", *self.web_args])
        wait_until(lambda: self._port_open(), timeout=60, what="the web server")
        if self.celery:
            self._spawn("worker", ["-m", "celery", "-A", "config", "worker", "--pool", "solo", "--without-mingle",
                                   "--without-gossip", "--loglevel", "WARNING"])
            self._spawn("beat", ["-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING",
                                 "--schedule", str(self.tmp / "beat-schedule")])
        for node in self.seed["nodes"] if self.start_agents else ():
            self.start_agent(node)
        return self

    @contextlib.contextmanager
    def running(self):
        """The started stack, stopped afterwards; its processes' logs printed when something failed."""
        try:
            yield self.start()
        except Exception:
            print(self.logs())
            raise
        finally:
            self.stop()

    def start_agent(self, node: dict, *, command: tuple[str, ...] = (sys.executable, "-m", "nodeagent"),
                    env: dict | None = None) -> subprocess.Popen:
        """`command`: what runs the agent (default this checkout's package; an installed `gpumarket-agent`)."""
        program, *prefix = command
        return self._spawn(f"agent-{node['name']}", [
            *prefix, "--server", f"ws://127.0.0.1:{self.port}/ws/agent/", "--simulate", node["simulate"],
            "--hostname", f"{node['name']}.e2e", "--interval", str(self.agent_interval), "--seed", "7",
            *self.agent_args],
            {"NODEAGENT_TOKEN": node["token"], **(env or {})}, program=program)

    def _port_open(self) -> bool:
        return self._port_open_at(self.port)

    @staticmethod
    def _port_open_at(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    def api(self, method: str, path: str, body: dict | None = None, *, key: str | None = None) -> tuple[int, dict]:
        """Call the REST API as the seeded provider, or as whoever `key` (an API key) belongs to."""
        req = urllib.request.Request(self.url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {key or self.seed['api_key']}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        os.killpg(proc.pid, sig)
        proc.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.tmp.glob("*.log"))

    def stop(self) -> None:
        for name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
