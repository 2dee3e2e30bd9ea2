"""The runtime's tests on the real engine (tests/enginefix.py: `engine_url`, `engine`, `engine_node`, the test
images): a collector of what a runtime reports, runtimes made on the engine, and start_workload specs shaped as the
server sends them."""
from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Callable

import pytest

from nodeagent import protocol
from tests.enginefix import remove_ours


class Frames:
    """What a runtime reported, in order: thread-safe, each frame checked against the protocol as it comes."""

    def __init__(self) -> None:
        self._frames: list[dict] = []
        self._arrivals: list[float] = []  # time.monotonic() of each frame
        self._changed = threading.Condition()
        self.invalid: list[tuple[dict, str]] = []  # frames the server would refuse, with the reason

    def __call__(self, frame: dict) -> None:
        try:
            protocol.validate(protocol.decode(protocol.encode(frame)))
        except (protocol.ProtocolError, ValueError) as exc:
            self.invalid.append((frame, str(exc)))
        with self._changed:
            self._frames.append(frame)
            self._arrivals.append(time.monotonic())
            self._changed.notify_all()

    def all(self, lease: str | None = None) -> list[dict]:
        with self._changed:
            return [f for f in self._frames if lease is None or f.get("lease") == lease]

    def arrived_after(self, moment: float) -> list[dict]:
        """The frames reported after `moment` (a time.monotonic() reading)."""
        with self._changed:
            return [f for f, at in zip(self._frames, self._arrivals) if at > moment]

    def states(self, lease: str) -> list[str]:
        return [f["state"] for f in self.all(lease) if f["type"] == "workload"]

    def output(self, lease: str) -> str:
        return "".join(f["data"] for f in self.all(lease) if f["type"] == "logs")

    def wait_for(self, predicate: Callable[[Frames], Any], *, timeout: float = 10.0, what: str = "") -> Any:
        """The first truthy value of `predicate(self)`, checked at every new frame; AssertionError after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = predicate(self)
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}; "
                                         f"reported: {self._frames!r}")
                self._changed.wait(left)

    def wait_state(self, lease: str, state: str, *, timeout: float = 10.0) -> dict:
        """The first `workload` frame of the lease in `state`."""
        return self.wait_for(lambda f: next((x for x in f.all(lease) if x["type"] == "workload"
                                             and x["state"] == state), None),
                             timeout=timeout, what=f"lease {lease} {state}")

    def wait_output(self, lease: str, text: str, *, timeout: float = 10.0) -> str:
        return self.wait_for(lambda f: text in f.output(lease) and f.output(lease), timeout=timeout,
                             what=f"{text!r} in the output of lease {lease}")


@pytest.fixture
def frames() -> Frames:
    collected = Frames()
    yield collected
    assert not collected.invalid, f"frames the server would refuse: {collected.invalid}"


@pytest.fixture
def make_runtime(engine_url, engine, engine_node, frames):
    """DockerRuntime(**overrides) on the engine, reporting to `frames`, labelling with this session's node, its
    ports on loopback and no GPU (these machines have none); closed, and its containers removed, after the test."""
    from nodeagent.runtime.docker import DockerRuntime

    made = []

    def make(**overrides) -> DockerRuntime:
        kwargs = {"gpu_devices": "none", "bind_address": "127.0.0.1", "report": frames, "node": engine_node,
                  **overrides}
        runtime = DockerRuntime(engine_url, **kwargs)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.close()
    remove_ours(engine, engine_node)


@pytest.fixture
def runtime(make_runtime):
    return make_runtime()


@pytest.fixture
def lease() -> str:
    return str(uuid.uuid4())


GPU_UUID = "GPU-2f3c51a4-1b7e-4c1e-9a55-3c0d6e9b7a10"
INSTANCE_UUID = "MIG-7d5e3b9c-8a41-5f2e-b6d0-1c9a4e7f2b83"


def workload_spec(image: str, *, command: list[str] | None = None, args: list[str] | None = None,
                  env: dict[str, str] | None = None, ports: list[dict] | None = None, cpus: float = 0.5,
                  memory_mb: int = 256, disk_gb: int | None = None, ssh_keys: list[str] | None = None,
                  notice: str = "sigterm", kind: str = "interactive", max_seconds: int | None = None) -> dict:
    """A start_workload spec shaped as the server sends it (marketplace.lifecycle.workloads.spec_for)."""
    spec = {
        "image": image, "command": list(command or []), "args": list(args or []), "env": dict(env or {}),
        "secret_names": [], "ports": [{"protocol": "tcp", **p} for p in ports or []],
        "limits": {"cpus": cpus, "memory_mb": memory_mb, "disk_gb": disk_gb},
        "device": {"gpu_uuid": GPU_UUID, "instance_uuid": INSTANCE_UUID},
        "ssh_keys": list(ssh_keys or []), "notice": notice, "kind": kind,
    }
    if max_seconds is not None:
        spec["max_seconds"] = max_seconds
    protocol.validate_workload_spec(spec)
    return spec
