"""The interface every backend (NVML, simulated) offers to the agent's client.

Methods are synchronous and may block (NVML talks to the driver); the client calls them through
`asyncio.to_thread`. Implementations serialise their own state with a lock, since a metrics sample and a
command may run in two threads at once. Failures are `BackendError`s carrying a protocol error code.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ..errors import not_supported


class Backend(ABC):
    #: "nvml" or "simulated": reported in `hello.backend`.
    name: str = "abstract"

    @abstractmethod
    def inventory(self) -> dict[str, Any]:
        """Node facts and GPUs, shaped for `protocol.hello`.

        Returns {"hostname", "driver_version", "cuda_version", "backend", "gpus": [gpu, ...]} where a gpu is
        {uuid, index, name, model (catalog key or None), memory_mib, mig_enabled,
         mig: MigGeometry.to_dict()-shaped dict or None, instances: [{uuid, profile, start, size}]}.
        """

    @abstractmethod
    def create_instance(self, gpu_uuid: str, profile: str, start: int) -> dict[str, Any]:
        """Carve a MIG GPU instance (and its full compute instance) at `start`.

        Returns {instance_uuid ("MIG-..."), gpu_uuid, profile, start, size, cuda_visible_devices}.
        Raises BackendError: E_NOT_FOUND (no such GPU), E_PLACEMENT (unknown profile or illegal start),
        E_INSUFFICIENT (overlap, count or compute limit), E_NOT_SUPPORTED (GPU without MIG enabled).
        """

    @abstractmethod
    def destroy_instance(self, gpu_uuid: str, instance_uuid: str) -> dict[str, Any]:
        """Destroy the compute instances and then the GPU instance; E_NOT_FOUND if there is none."""

    @abstractmethod
    def sample(self) -> list[dict[str, Any]]:
        """One metrics dict per GPU, fields as `protocol.validate_metrics` reads them.

        {uuid, util, mem_used_mib, mem_total_mib, temp_c, power_w, sm_clock_mhz, ecc_sbe, ecc_dbe,
         xid: [XID codes seen since the previous sample]}; a metric the GPU cannot report is None.
        """

    def set_busy(self, gpu_uuid: str, instance_uuid: str, busy: float | bool) -> dict[str, Any]:
        """Simulated load on an instance (or a whole GPU when instance_uuid is the GPU's uuid)."""
        raise not_supported(f"set_busy is only available on the simulated backend, not {self.name}")

    def inject_fault(self, gpu_uuid: str, fault: str, xid: int | None = None) -> dict[str, Any]:
        """Simulated fault: overheat | power | ecc | xid | clear."""
        raise not_supported(f"inject_fault is only available on the simulated backend, not {self.name}")

    def close(self) -> None:
        """Release driver resources; the default has none."""
