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
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from marketplace.management import localstripe

ROOT = Path(__file__).resolve().parents[2]

# What a signed-in browser holds: a session in the database (any web process reads it) for `user`.
SESSION = r"""
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.auth import SESSION_KEY, BACKEND_SESSION_KEY, HASH_SESSION_KEY
def session_for(user):
    s = SessionStore()
    s[SESSION_KEY] = str(user.pk); s[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    s[HASH_SESSION_KEY] = user.get_session_auth_hash(); s.create()
    return s.session_key
"""

SEED = SESSION + r"""
import json
from django.contrib.auth import get_user_model
from marketplace.products.accounts.providers import PROVIDER_TERMS_VERSION, provider_onboard
from marketplace.products.apikeys import api_key_create
from scheduler.services.nodes import node_register
spec = json.loads(%r)
user = get_user_model().objects.create_user("e2e-provider", password="e2e-password")
provider_onboard(user=user, display_name="e2e provider", payout_country="DE", terms_accepted=True,
                 terms_version=PROVIDER_TERMS_VERSION)
nodes = []
for name, simulate in spec:
    node, token = node_register(provider=user, name=name)
    nodes.append({"id": str(node.pk), "name": name, "token": token, "simulate": simulate})
_, key = api_key_create(user=user, name="e2e")
print("SEED" + json.dumps({"nodes": nodes, "api_key": key, "session": session_for(user)}))
"""

# Buyers with money in their wallets (a top-up through the ledger, as Stripe's would be), each with an API key
# and a signed-in session: [{"name", "api_key", "session"}].
BUYERS = SESSION + r"""
import json
from decimal import Decimal
from django.contrib.auth import get_user_model
from marketplace.money import ledger
from marketplace.products.apikeys import api_key_create
names, credit, scopes = json.loads(%r)
buyers = []
for name in names:
    user = get_user_model().objects.create_user(name, password="e2e-password")
    ledger.post(kind="topup", memo="e2e top-up", idempotency_key=f"e2e-topup-{name}",
                lines=[(ledger.platform_account("stripe_clearing"), -Decimal(credit)),
                       (ledger.account_for(user=user, kind="wallet"), Decimal(credit))])
    _, key = api_key_create(user=user, name="e2e", **({"scopes": scopes} if scopes else {}))
    buyers.append({"name": name, "id": user.pk, "api_key": key, "session": session_for(user)})
print("BUYERS" + json.dumps(buyers))
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
                 celery: bool = True, agent_interval: float = 1.0, stripe: bool = False,
                 start_agents: bool = True, web_args: tuple[str, ...] = (), agent_args: tuple[str, ...] = ()):
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.spawned: dict[str, tuple[str, list[str], dict]] = {}  # name -> how it was started, for restart()
        self.celery = celery
        self.stripe = stripe  # a local fake Stripe (localstripe) the web and worker pay through
        self.agent_interval = agent_interval
        self.start_agents = start_agents
        self.web_args = tuple(web_args)
        self.agent_args = tuple(agent_args)  # e.g. the container runtime: --runtime docker --engine-url ...
        base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        # The demo's settings, DEBUG off as in the demo and production: an error is the product's, not a traceback.
        self.env = {**base, "DJANGO_SETTINGS_MODULE": "config.settings.dev", "DJANGO_DEBUG": "0",
                    "GPUMARKET_VAR_DIR": str(tmp), "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "WARNING",
                    **(env or {})}
        self.spec = nodes

    def _run(self, *argv: str) -> str:
        out = subprocess.run([sys.executable, *argv], cwd=ROOT, env=self.env, capture_output=True, text=True,
                             timeout=180)
        if out.returncode != 0:
            raise RuntimeError(f"{argv} failed: {out.stderr[-2000:]}")
        return out.stdout

    def shell(self, code: str, tag: str | None = None):
        """Run Django code against the stack's database (`manage.py shell -c`): its output, or the JSON it
        printed after `tag`."""
        out = self._run("manage.py", "shell", "-c", code)
        return json.loads(out[out.index(tag) + len(tag):]) if tag else out

    def _spawn(self, name: str, argv: list[str], env: dict | None = None, *,
               program: str = sys.executable) -> subprocess.Popen:
        self.spawned[name] = (program, argv, env or {})
        with open(self.tmp / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([program, *argv], cwd=ROOT, env={**self.env, **(env or {})}, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def start(self) -> "LiveStack":
        if self.stripe:
            self._start_stripe()
        self._run("manage.py", "migrate", "-v", "0")
        self.seed = self.shell(SEED % json.dumps(self.spec), "SEED")
        self._start_processes()
        if self.stripe:
            localstripe.register_webhook(api_base=self.stripe_base, url=f"{self.url}/stripe/webhook/",
                                         secret=self.env["STRIPE_WEBHOOK_SECRET"])
        return self

    def _start_stripe(self) -> None:
        """localstripe on a port of its own; the stack's processes get its keys (test mode) and its webhook."""
        if not localstripe.available():
            raise RuntimeError("localstripe is not installed: pip install -r requirements-dev.txt")
        self.stripe_port = localstripe.free_port()
        self.stripe_base = f"http://127.0.0.1:{self.stripe_port}"
        self.env.update({"STRIPE_SECRET_KEY": "sk_test_e2e", "STRIPE_PUBLISHABLE_KEY": "pk_test_e2e",
                         "STRIPE_API_BASE": self.stripe_base, "STRIPE_WEBHOOK_SECRET": "whsec_e2e_tests"})
        self._spawn("localstripe", localstripe.argv(port=self.stripe_port)[1:])
        if not localstripe.wait_until_listening(port=self.stripe_port):
            raise RuntimeError("localstripe did not start")

    def _start_processes(self) -> None:
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

    def add_buyers(self, names: list[str], *, credit: str = "1000", scopes: list[str] | None = None) -> list[dict]:
        """Buyers with `credit` USD in their wallets, each with an API key (of `scopes`, default all) and a console
        session."""
        return self.shell(BUYERS % json.dumps([names, credit, scopes]), "BUYERS")

    def agent_server(self, node: dict) -> str:
        """The agent socket URL `node`'s agent connects to."""
        return f"ws://127.0.0.1:{self.port}/ws/agent/"

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
        """`command`: what runs the agent (default this checkout's package; an installed `gpumarket-agent`). Each
        simulated machine keeps its MIG instances and containers in its own state file (`agent_state`), so an agent
        killed and started again finds them, as on real hardware."""
        program, *prefix = command
        return self._spawn(f"agent-{node['name']}", [
            *prefix, "--server", self.agent_server(node), "--simulate", node["simulate"],
            "--hostname", f"{node['name']}.e2e", "--interval", str(self.agent_interval), "--seed", "7",
            "--state-file", str(self.agent_state(node["name"])), *self.agent_args],
            {"NODEAGENT_TOKEN": node["token"], **(env or {})}, program=program)

    def agent_state(self, name: str) -> Path:
        """The state file of node `name`'s simulated machine (nodeagent/sim_state.py)."""
        return self.tmp / "agents" / name / "state.json"

    @property
    def web_urls(self) -> list[str]:
        """The base URL of each web process (one here)."""
        return [self.url]

    def web_url(self, web: int = 0) -> str:
        return self.web_urls[web % len(self.web_urls)]

    def api(self, method: str, path: str, body: dict | None = None, *, key: str | None = None,
            web: int = 0) -> tuple[int, dict]:
        """Call the REST API through web process `web`, as the seeded provider or as whoever `key` (an API key)
        belongs to."""
        return call_api(self.web_url(web), method, path, body, key=key or self.seed["api_key"])

    def console_url(self, web: int = 0) -> str:
        return self.web_url(web).replace("http://", "ws://", 1) + "/ws/console/"

    def console_headers(self, session: str, web: int = 0) -> dict:
        """What a signed-in browser sends when it opens the console socket of web process `web`."""
        return {"Cookie": f"sessionid={session}", "Origin": self.web_url(web)}

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the process `name` (and its children); wait for it to end unless the signal only pauses
        or nudges it (SIGSTOP, SIGHUP...)."""
        proc = self.procs[name]
        os.killpg(proc.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            proc.wait(timeout=10)

    def restart(self, name: str) -> subprocess.Popen:
        """Start `name` again as it was first started (stopping it first if it still runs)."""
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        program, argv, env = self.spawned[name]
        return self._spawn(name, argv, env, program=program)

    def _port_open(self) -> bool:
        return self._port_open_at(self.port)

    @staticmethod
    def _port_open_at(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

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


def call_api(base: str, method: str, path: str, body: dict | None = None, *, key: str,
             timeout: float = 10) -> tuple[int, dict]:
    """One REST call with an API key: (status, JSON body)."""
    req = urllib.request.Request(base + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw or b"{}")
        except ValueError:  # not JSON (a proxy's or the server's plain 500 page): kept to be reported
            return err.code, {"raw": raw.decode(errors="replace")[:500]}


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's naming)
        self.server.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def webhook_receiver():
    """A local webhook receiver: yields (its URL, the list of JSON bodies POSTed to it so far)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    server.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/notices", server.received
    finally:
        server.shutdown()
