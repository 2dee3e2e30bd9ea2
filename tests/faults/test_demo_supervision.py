"""`manage.py demo` for real: a worker killed with -9 is started again with a line saying so, an agent whose
token was rotated is reported and left stopped, and only SIGTERM stops everything."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.e2e.livestack import call_api, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e

PROVIDER_KEY = """
from django.contrib.auth import get_user_model
from marketplace.products.apikeys import api_key_create
from scheduler.models import Node
_, key = api_key_create(user=get_user_model().objects.get(username="provider"), name="supervision test")
print("KEY", key, Node.objects.get(name="demo-l4").pk)
"""


def _children(pid: int) -> dict[int, str]:
    """Every descendant process of `pid` with its command line (the demo starts each child in its own session)."""
    parents, cmdlines = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
                cmdlines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
    found, frontier = {}, {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier}
        found.update({p: cmdlines.get(p, "") for p in frontier})
    return found


def _direct(pid: int, needle: str) -> list[int]:
    kids = _children(pid)
    return [p for p, cmd in kids.items() if needle in cmd and _parent(p) == pid]


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


@pytest.fixture
def demo(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "STRIPE_SECRET_KEY")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings.dev", GPUMARKET_VAR_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    port, stripe_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "manage.py", "demo", "--port", str(port), "--stripe-port",
                             str(stripe_port)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    proc.lines, proc.env, proc.url = lines, env, f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: any("Press Ctrl-C" in line for line in lines) or proc.poll() is not None, timeout=120,
                   what="the demo running")
        assert proc.poll() is None, "".join(lines)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            for child in _children(proc.pid):
                try:
                    os.kill(child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        print("".join(lines))


def test_the_demo_restarts_a_killed_worker_leaves_a_rotated_agent_stopped_and_stops_only_on_sigterm(demo, tmp_path):
    (worker,) = _direct(demo.pid, "celery -A config worker")
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: any("worker was killed by SIGKILL" in line for line in demo.lines), timeout=20,
               what="the demo saying the worker was killed")
    wait_until(lambda: _direct(demo.pid, "celery -A config worker"), timeout=30, what="a new worker")
    assert any("worker started again (restart 1)" in line for line in demo.lines)

    # The provider rotates the node's token through the API, as the console's button does.
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", PROVIDER_KEY], cwd=ROOT, env=demo.env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    _, key, node_id = out.stdout[out.stdout.index("KEY"):].split()
    status, _ = call_api(demo.url, "POST", f"/api/v1/nodes/{node_id}/rotate-token/", {}, key=key)
    assert status == 200
    wait_until(lambda: any("agent-demo-l4 exited with code 3" in line for line in demo.lines), timeout=30,
               what="the demo reporting the agent whose token was rotated")
    said = "".join(demo.lines)
    assert "It stays stopped" in said and "NODEAGENT_TOKEN='<the node'\"'\"'s new token>'" in said, said
    assert "--simulate l4:2,l40s:1" in said
    # It is not started again; the demo and the other agents keep running.
    threading.Event().wait(3)
    assert demo.poll() is None
    agents = [cmd for p, cmd in _children(demo.pid).items() if "nodeagent" in cmd and _parent(p) == demo.pid]
    assert len(agents) == 2 and not any("demo-l4" in cmd for cmd in agents)

    os.killpg(demo.pid, signal.SIGTERM)
    assert demo.wait(timeout=60) == 0
    wait_until(lambda: not _children(demo.pid), timeout=30, what="every child stopped")
    assert any("stopped." in line for line in demo.lines)
