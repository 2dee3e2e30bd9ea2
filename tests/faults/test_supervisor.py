"""The demo's supervisor on real child processes with a hand-moved clock: restarts with backoff, final exits."""
from __future__ import annotations

import sys

from marketplace.management.supervisor import BACKOFF_SECONDS, STABLE_SECONDS, Child, Supervisor


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _exits(code: int) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.exit({code})"]


def _run(sup: Supervisor, child: Child) -> None:
    child.proc.wait(timeout=30)
    sup.check()


def test_a_child_that_exits_is_started_again_after_a_backoff_that_grows_and_resets_after_a_stable_run(tmp_path):
    lines, clock = [], Clock()
    sup = Supervisor(lines.append, clock=clock)
    worker = sup.start(Child("worker", _exits(1), tmp_path / "worker.log"))
    delays = []
    for _ in range(len(BACKOFF_SECONDS) + 1):
        _run(sup, worker)
        delays.append(worker.restart_at - clock.now)
        clock.now = worker.restart_at
        sup.check()
    assert delays == [*BACKOFF_SECONDS, BACKOFF_SECONDS[-1]]
    assert worker.restarts == len(delays)
    assert lines[0] == f"worker exited with code 1 (see {tmp_path / 'worker.log'}); starting it again in 1 s"
    assert lines[1] == "worker started again (restart 1)"
    # A run that lasted past STABLE_SECONDS starts the backoff from the beginning.
    clock.now += STABLE_SECONDS
    _run(sup, worker)
    assert worker.restart_at - clock.now == BACKOFF_SECONDS[0]
    sup.stop_all()


def test_an_agent_whose_token_was_refused_is_reported_with_its_command_and_left_stopped(tmp_path):
    lines, clock = [], Clock()
    sup = Supervisor(lines.append, clock=clock)
    agent = sup.start(Child("agent-h100", _exits(3), tmp_path / "agent.log",
                            final={3: "the server refused its node token (rotated or revoked)"},
                            by_hand="NODEAGENT_TOKEN='<the node's new token>' python -m nodeagent --server ws://x/"))
    _run(sup, agent)
    clock.now += 3600
    sup.check()
    assert agent.stopped and agent.restarts == 0 and agent.restart_at is None
    assert lines == ["agent-h100 exited with code 3: the server refused its node token (rotated or revoked). It stays "
                     "stopped; once that is fixed, start it with:\n    NODEAGENT_TOKEN='<the node's new token>' "
                     "python -m nodeagent --server ws://x/"]


def test_stop_all_stops_every_running_child(tmp_path):
    sup = Supervisor(lambda line: None)
    sleepers = [sup.start(Child(f"c{i}", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / f"{i}.log"))
                for i in range(3)]
    sup.stop_all(grace=10)
    assert all(c.proc.poll() is not None for c in sleepers)


def test_what_a_child_needs_again_after_a_restart_is_done_and_said(tmp_path):
    """The fake Stripe keeps its webhooks in memory: the demo registers them again after each restart."""
    lines, clock, calls = [], Clock(), []

    def again():
        calls.append(clock.now)
        if len(calls) == 2:
            raise RuntimeError("localstripe did not start")
        return "localstripe: the payment webhook is registered again"

    sup = Supervisor(lines.append, clock=clock)
    stripe = sup.start(Child("localstripe", _exits(1), tmp_path / "stripe.log", after_restart=again))
    assert calls == []  # not at the first start: the demo does that itself
    for _ in range(2):
        _run(sup, stripe)
        clock.now = stripe.restart_at
        sup.check()
    assert len(calls) == 2
    assert lines.count("localstripe: the payment webhook is registered again") == 1
    assert "localstripe: localstripe did not start" in lines
    sup.stop_all()
