"""`manage.py demo` stops every process it started, however it is interrupted (no real processes here)."""
from __future__ import annotations

import itertools

import pytest
from django.core.management import call_command

from marketplace.management import supervisor
from marketplace.management.commands import demo

pytestmark = pytest.mark.django_db


class FakeProc:
    pids = itertools.count(900000)

    def __init__(self, argv, **kw):
        self.argv, self.pid, self.returncode = argv, next(self.pids), None
        self.env = kw.get("env") or {}

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        self.returncode = -15
        return self.returncode


@pytest.fixture
def fake_children(monkeypatch, tmp_path, settings):
    started, killed = [], []

    def popen(argv, **kw):
        proc = FakeProc(argv, **kw)
        started.append(proc)
        return proc

    def killpg(pid, sig):
        killed.append(pid)
        next(p for p in started if p.pid == pid).returncode = -sig

    settings.VAR_DIR = tmp_path
    monkeypatch.setattr(supervisor.subprocess, "Popen", popen)
    monkeypatch.setattr(supervisor.os, "killpg", killpg)
    monkeypatch.setattr(demo.signal, "signal", lambda *a: None)  # keep pytest's own handlers
    monkeypatch.setattr(demo, "_port_free", lambda host, port: True)
    monkeypatch.setattr(demo.localstripe, "available", lambda: True)
    monkeypatch.setattr(demo.localstripe, "wait_until_listening", lambda **kw: True)
    monkeypatch.setattr(demo.localstripe, "register_webhook", lambda **kw: None)
    return started, killed


def test_ctrl_c_while_the_web_server_is_starting_stops_what_was_already_started(fake_children, monkeypatch):
    started, killed = fake_children

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "_wait_for_port", interrupted)
    with pytest.raises(KeyboardInterrupt):
        call_command("demo")
    assert len(started) == 4  # localstripe, web, worker, beat
    assert sorted(killed) == sorted(p.pid for p in started)


def test_a_web_server_that_does_not_start_stops_the_others_with_a_message(fake_children, monkeypatch):
    from django.core.management.base import CommandError

    started, killed = fake_children
    monkeypatch.setattr(demo, "_wait_for_port", lambda *a: False)
    with pytest.raises(CommandError, match="web server did not start"):
        call_command("demo")
    assert sorted(killed) == sorted(p.pid for p in started)


@pytest.mark.parametrize("engine_url, runtime", [("", "simulated"), ("unix:///run/podman/podman.sock", "docker")])
def test_the_demo_starts_each_agent_with_its_runtime_and_says_which(fake_children, monkeypatch, capsys, engine_url,
                                                                      runtime):
    started, killed = fake_children
    monkeypatch.setattr(demo, "_wait_for_port", lambda *a: True)
    monkeypatch.setattr(demo.time, "sleep", lambda s: (_ for _ in ()).throw(KeyboardInterrupt))
    call_command("demo", engine_url=engine_url)
    agents = [p.argv for p in started if "nodeagent" in p.argv]
    assert len(agents) == 3
    for argv in agents:
        assert argv[argv.index("--runtime") + 1] == runtime
        if engine_url:
            assert argv[argv.index("--engine-url") + 1] == engine_url
            assert argv[argv.index("--gpu-devices") + 1] == "none"
    out = capsys.readouterr().out
    assert out.count(f": {runtime} (") == 3, out
    web = next(p for p in started if "uvicorn" in p.argv)
    token = web.env["METRICS_TOKEN"]  # /metrics is on in the demo, with the token it prints
    assert len(token) >= 16 and f"metrics with 'Authorization: Bearer {token}'" in out
    assert sorted(killed) == sorted(p.pid for p in started)


def test_the_demo_pays_payouts_by_a_simulated_transfer_unless_told_otherwise(fake_children, monkeypatch):
    """localstripe has no Connect: the demo's processes get simulated transfers, no hold and a 1.00 minimum; a
    value the environment gives is kept."""
    started, _ = fake_children
    monkeypatch.setenv("PAYOUT_HOLD_DAYS", "3")
    monkeypatch.setattr(demo, "_wait_for_port", lambda *a: False)
    with pytest.raises(Exception):
        call_command("demo")
    web = next(p for p in started if "uvicorn" in p.argv)
    assert (web.env["PAYOUT_TRANSFERS"], web.env["PAYOUT_MINIMUM"], web.env["PAYOUT_HOLD_DAYS"]) == (
        "simulated", "1.00", "3")
