"""The demo's supervisor: every child that exits is started again after a backoff, and says so in one line.

A child whose exit code says that starting it again cannot help (an agent whose node token the server refused,
or that another agent replaced) is reported with the command that starts it by hand and left stopped. Only
`stop_all` — Ctrl-C or SIGTERM in the demo — stops everything.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

BACKOFF_SECONDS = (1, 2, 4, 8, 16, 30)
STABLE_SECONDS = 60.0  # a child that ran this long before exiting starts its backoff from the beginning again


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    env: dict = field(default_factory=dict)
    # Exit codes after which a restart cannot help: code -> why, in the user's words.
    final: dict[int, str] = field(default_factory=dict)
    # What the user runs to start it by hand once they fixed that (shown with the reason).
    by_hand: str = ""
    # Called after each restart (not the first start): what the child needs from us again, e.g. the fake Stripe
    # keeps its webhook registrations in memory. It returns a line to say, or raises to have it said as a problem.
    after_restart: Callable[[], str | None] | None = None
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    failures: int = 0  # exits in a row without a stable run in between
    restarts: int = 0
    restart_at: float | None = None
    stopped: str | None = None  # why it stays stopped


def exit_said(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def command_line(argv: list[str], env: dict[str, str]) -> str:
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(argv)])


class Supervisor:
    def __init__(self, say: Callable[[str], None], *, popen=None, clock=time.monotonic, base_env=None):
        self.say, self.clock = say, clock
        self.popen = popen or (lambda *args, **kwargs: subprocess.Popen(*args, **kwargs))
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.children: list[Child] = []

    def start(self, child: Child) -> Child:
        if child not in self.children:
            self.children.append(child)
        out = open(child.log, "ab")
        try:
            child.proc = self.popen(child.argv, env={**self.base_env, **child.env}, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()
        child.started_at, child.restart_at = self.clock(), None
        return child

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def check(self) -> None:
        """Look at every child once: report and schedule the ones that exited, restart the ones that are due."""
        now = self.clock()
        for child in self.children:
            if child.stopped:
                continue
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self.start(child)
                    child.restarts += 1
                    self.say(f"{child.name} started again (restart {child.restarts})")
                    if child.after_restart is not None:
                        try:
                            said = child.after_restart()
                        except Exception as exc:  # noqa: BLE001 (said, and the child keeps being supervised)
                            said = f"{child.name}: {exc}"
                        if said:
                            self.say(said)
                continue
            code = child.proc.poll() if child.proc is not None else None
            if code is None:
                continue
            if code in child.final:
                child.stopped = child.final[code]
                self.say(f"{child.name} {exit_said(code)}: {child.stopped}. It stays stopped; once that is fixed, "
                         f"start it with:\n    {child.by_hand or shlex.join(child.argv)}")
                continue
            child.failures = 1 if now - child.started_at >= STABLE_SECONDS else child.failures + 1
            delay = BACKOFF_SECONDS[min(child.failures, len(BACKOFF_SECONDS)) - 1]
            child.restart_at = now + delay
            self.say(f"{child.name} {exit_said(code)} (see {child.log}); starting it again in {delay} s")

    def stop_all(self, grace: float = 10.0) -> None:
        running = [c.proc for c in reversed(self.children) if c.proc is not None and c.proc.poll() is None]
        for proc in running:
            _killpg(proc.pid, signal.SIGTERM)
        deadline = self.clock() + grace
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
