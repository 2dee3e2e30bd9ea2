"""A runtime without an engine: the same states and reports as a real one, in memory, so the demo shows a lease's
workload on a laptop. It "pulls" (with progress), starts, runs writing log lines, and a job exits after
SIM_RUN_SECONDS (from its environment, default 5) with SIM_EXIT_CODE (default 0). An image reference ending in
":missing" does not exist, to show the failure path. Notices and stops are logged as a container would see them.
Given a state file (nodeagent/sim_state.py) its containers outlive the agent, as an engine's do: a restarted agent
finds them (`found`) and the server adopts them.
"""
from __future__ import annotations

import itertools
import random
import threading
import time
import uuid as uuidlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from .. import protocol
from ..errors import BackendError
from ..sim_state import StateFile
from .base import Report, Runtime, WorkloadSpec, state

PULL_SECONDS = 0.3
LOG_EVERY_SECONDS = 0.5


@dataclass
class _Sim:
    spec: WorkloadSpec
    container: str
    started: float = 0.0
    exit_code: int | None = None
    stop: threading.Event = field(default_factory=threading.Event)


class SimulatedRuntime(Runtime):
    name = "simulated"

    def __init__(self, report: Report | None = None, node: str = "", *, seed: int | None = None,
                 pull_seconds: float = PULL_SECONDS, log_every: float = LOG_EVERY_SECONDS,
                 state: StateFile | None = None, clock: Callable[[], float] = time.time) -> None:
        super().__init__(report, node)
        # What "now" is (epoch seconds): the wall clock, or a test's own clock so that a replayed test sees the
        # same start times.
        self.clock = clock
        self.pull_seconds, self.log_every = pull_seconds, log_every
        self._lock = threading.Lock()
        self._running: dict[str, _Sim] = {}
        self._rng = random.Random(seed)
        self.state = state
        for kept in (state.load("containers") if state else None) or []:
            sim = self._running[kept["spec"]["lease"]] = _Sim(WorkloadSpec(**kept["spec"]), kept["container"],
                                                              kept["started"], kept["exit_code"])
            if sim.exit_code is None:  # still running: its log goes on
                self._watch(sim)

    def _persist(self) -> None:
        """Write the containers there are now (called under the lock, after each change)."""
        if self.state is not None:
            self.state.save("containers", [{"spec": asdict(s.spec), "container": s.container, "started": s.started,
                                            "exit_code": s.exit_code} for s in self._running.values()])

    def _watch(self, sim: _Sim) -> None:
        threading.Thread(target=self._run, args=(sim,), name=f"sim-{sim.spec.lease[:8]}", daemon=True).start()

    def start(self, spec: WorkloadSpec) -> dict[str, Any]:
        with self._lock:
            sim = self._running.get(spec.lease)
            if sim is not None:  # a repeated start: the same container
                return {"container": sim.container, "state": "running" if sim.exit_code is None else "exited"}
            sim = self._running[spec.lease] = _Sim(spec, container=uuidlib.uuid4().hex)
        self._state(spec.lease, "pulling", progress=f"pulling {spec.image}")
        time.sleep(self.pull_seconds)
        if spec.image.endswith(":missing"):
            with self._lock:
                self._running.pop(spec.lease, None)
                self._persist()
            reason = f"the image {spec.image} could not be pulled: manifest unknown"
            self._state(spec.lease, "failed", reason=reason)
            raise BackendError(protocol.E_INTERNAL, reason)
        self._state(spec.lease, "starting")
        with self._lock:
            sim.started = self.clock()
            self._persist()
        self._state(spec.lease, "running", container=sim.container, at=sim.started)
        self._watch(sim)
        return {"container": sim.container, "state": "running"}

    def _state(self, lease: str, state_name: str, **kw: Any) -> None:
        state(self.report, lease, state_name, **{"at": self.clock(), **kw})

    def _run(self, sim: _Sim) -> None:
        spec = sim.spec
        run_for = float(spec.env.get("SIM_RUN_SECONDS", "5")) if spec.kind == "job" else None
        code = int(spec.env.get("SIM_EXIT_CODE", "0"))
        self.report(protocol.logs(lease=spec.lease, data=f"[simulated] {spec.image} on {spec.device_instance}: "
                                                         f"{spec.cpus:g} CPUs, {spec.memory_mb} MB\n"))
        loss = 2.5
        for step in itertools.count(1):
            if sim.stop.wait(self.log_every):
                return
            loss *= 0.97 + 0.02 * self._rng.random()
            self.report(protocol.logs(lease=spec.lease, data=f"step {step}: loss {loss:.4f}\n"))
            if run_for is not None and self.clock() - sim.started >= run_for:
                with self._lock:
                    sim.exit_code = code
                    self._persist()
                self._state(spec.lease, "exited", container=sim.container, exit_code=code)
                return

    def stop(self, lease: str, grace_seconds: float) -> dict[str, Any]:
        with self._lock:
            sim = self._running.pop(lease, None)
            self._persist()
        if sim is None:
            self._state(lease, "removed")
            return {"removed": False, "exit_code": None}
        sim.stop.set()
        if sim.exit_code is None:
            self.report(protocol.logs(lease=lease, data="[simulated] SIGTERM: stopping\n"))
            sim.exit_code = 143
        self._state(lease, "removed", exit_code=sim.exit_code)
        return {"removed": True, "exit_code": sim.exit_code}

    def notice(self, lease: str, mode: str, deadline: str, kind: str) -> dict[str, Any]:
        with self._lock:
            sim = self._running.get(lease)
        if sim is None:
            return {"delivered": False}
        what = "SIGTERM" if mode == "sigterm" else "a notice file"
        self.report(protocol.logs(lease=lease, data=f"[simulated] {what}: interrupted ({kind}) at {deadline}\n"))
        return {"delivered": True, "mode": mode}

    def found(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"lease": lease, "container": sim.container,
                     "state": "running" if sim.exit_code is None else "exited"} for lease, sim in self._running.items()]
