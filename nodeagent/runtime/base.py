"""What every runtime offers the agent: start a lease's container, stop it, give it a spot notice, and list the
containers of leases it finds (an agent that restarts adopts them, never duplicates them).

Runtimes are synchronous and may block (an image pull takes minutes): the agent calls them in threads. They
tell the agent what happens to a container through `report`, a thread-safe callable taking protocol frames
(`workload` state changes, `logs` chunks), which the agent sends to the server when it is connected.

Every container a runtime makes is named `gpm-<lease>` and labelled with the lease and the node: the agent's
namespace. A container of that name without the labels is a leftover and is removed.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import protocol
from ..errors import BackendError

Report = Callable[[dict], None]

LABEL_LEASE = "gpumarket.lease"
LABEL_NODE = "gpumarket.node"
LABEL_KIND = "gpumarket.kind"
NAME_PREFIX = "gpm-"
NOTICE_PATH = "/run/gpumarket/notice"  # where a notice file lands, for images that watch it


def container_name(lease: str) -> str:
    return f"{NAME_PREFIX}{lease}"


@dataclass
class WorkloadSpec:
    """A start_workload command's spec (protocol.validate_workload_spec), as the runtimes read it."""

    lease: str
    image: str
    device_gpu: str  # the physical GPU's uuid
    device_instance: str  # the MIG device uuid, or the GPU's for a whole GPU
    cpus: float
    memory_mb: int
    command: list[str] = field(default_factory=list)  # replaces the image's entrypoint when given
    args: list[str] = field(default_factory=list)  # replaces the image's command when given
    env: dict[str, str] = field(default_factory=dict)
    ports: list[dict] = field(default_factory=list)  # {container_port, host_port, protocol}
    disk_gb: int | None = None
    ssh_keys: list[str] = field(default_factory=list)
    notice: str = "sigterm"
    kind: str = "interactive"
    max_seconds: int | None = None

    @classmethod
    def from_command(cls, lease: str, spec: dict) -> "WorkloadSpec":
        protocol.validate_workload_spec(spec)
        return cls(lease=lease, image=spec["image"], device_gpu=spec["device"]["gpu_uuid"],
                   device_instance=spec["device"]["instance_uuid"], cpus=float(spec["limits"]["cpus"]),
                   memory_mb=int(spec["limits"]["memory_mb"]), command=list(spec.get("command") or []),
                   args=list(spec.get("args") or []), env=dict(spec.get("env") or {}),
                   ports=list(spec.get("ports") or []), disk_gb=spec["limits"].get("disk_gb"),
                   ssh_keys=list(spec.get("ssh_keys") or []), notice=spec.get("notice", "sigterm"),
                   kind=spec.get("kind", "interactive"), max_seconds=spec.get("max_seconds"))

    def device_env(self) -> dict[str, str]:
        """The device the container is given, as CUDA and the NVIDIA Container Toolkit read it."""
        return {"NVIDIA_VISIBLE_DEVICES": self.device_instance, "CUDA_VISIBLE_DEVICES": self.device_instance}

    def environment(self) -> dict[str, str]:
        """Its whole environment: the buyer's, the device, and the buyer's SSH keys for images whose own
        convention reads them from the environment (SSH_PUBLIC_KEYS, one per line; PUBLIC_KEY, the first)."""
        env = {**self.env, **self.device_env()}
        if self.ssh_keys:
            env.setdefault("SSH_PUBLIC_KEYS", "\n".join(self.ssh_keys))
            env.setdefault("PUBLIC_KEY", self.ssh_keys[0])
        return env


def state(report: Report, lease: str, state_name: str, **kw: Any) -> None:
    report(protocol.workload(lease=lease, state=state_name, at=kw.pop("at", None) or time.time(), **kw))


class Runtime(ABC):
    #: reported in hello.runtime: "docker", "simulated" or "none"
    name: str = "abstract"

    def __init__(self, report: Report | None = None, node: str = "") -> None:
        self.report: Report = report or (lambda frame: None)
        self.node = node

    def bind(self, report: Report, node: str) -> None:
        """The agent connects the runtime to its socket (and names the node once the server has)."""
        self.report, self.node = report, node or self.node

    @abstractmethod
    def start(self, spec: WorkloadSpec) -> dict[str, Any]:
        """Pull (when missing), create and start the lease's container; returns {container, state}. A lease
        whose container exists already is adopted, not started twice. Progress and the outcome are reported
        (pulling, starting, running; failed with the engine's reason, which also raises BackendError)."""

    @abstractmethod
    def stop(self, lease: str, grace_seconds: float) -> dict[str, Any]:
        """SIGTERM, `grace_seconds`, then kill; remove the container and its volumes. {removed, exit_code}."""

    @abstractmethod
    def notice(self, lease: str, mode: str, deadline: str, kind: str) -> dict[str, Any]:
        """Tell the container its lease is being interrupted: SIGTERM now (mode sigterm), or a file at
        NOTICE_PATH holding {kind, deadline} (mode file)."""

    @abstractmethod
    def found(self) -> list[dict[str, Any]]:
        """The containers of leases in this agent's namespace now: [{lease, container, state}]; leftovers
        without labels are removed on the way."""

    def close(self) -> None:
        """Stop watching containers (they keep running: a restarted agent adopts them)."""


class NoRuntime(Runtime):
    """No container engine here: workloads are refused with a reason the buyer can read."""

    name = "none"

    def _no(self) -> BackendError:
        return BackendError(protocol.E_NOT_SUPPORTED, "this node runs no container engine (start the agent with "
                                                      "--runtime docker or --runtime simulated)")

    def start(self, spec: WorkloadSpec) -> dict[str, Any]:
        raise self._no()

    def stop(self, lease: str, grace_seconds: float) -> dict[str, Any]:
        return {"removed": False, "exit_code": None}

    def notice(self, lease: str, mode: str, deadline: str, kind: str) -> dict[str, Any]:
        return {"delivered": False}

    def found(self) -> list[dict[str, Any]]:
        return []
