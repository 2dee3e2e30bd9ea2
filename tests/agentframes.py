"""Protocol frames an agent would send, built from the simulated backend (the real agent's inventory)."""
from __future__ import annotations

import time

from nodeagent import protocol
from nodeagent.backends.simulated import SimulatedBackend


def sim_backend(spec: str = "h100-80gb:2,l4:1", hostname: str = "sim-1", seed: int = 1) -> SimulatedBackend:
    return SimulatedBackend(spec, hostname=hostname, seed=seed)


def hello_from(backend: SimulatedBackend) -> dict:
    inv = backend.inventory()
    return protocol.hello(hostname=inv["hostname"], agent_version="test", backend=inv["backend"],
                          driver_version=inv["driver_version"], cuda_version=inv["cuda_version"], gpus=inv["gpus"])


def metrics_from(backend: SimulatedBackend) -> dict:
    return protocol.metrics(ts=time.time(), gpus=backend.sample())
