"""Real GPUs through NVML (the `pynvml` module of nvidia-ml-py).

The MIG geometry reported to the server is built from what NVML says (profile info and possible
placements), not from the catalog: profile IDs and even placements differ between models and driver
versions, and the driver is the final judge of what it will create. `pynvml` is imported lazily and can be
injected, so tests drive this backend with a fake shaped like the real module.
"""
from __future__ import annotations

import ctypes
import logging
import math
import re
import socket
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from nodeagent.hardware import gpus as catalog

from .. import protocol
from ..errors import BackendError, not_found, not_supported
from .base import Backend

log = logging.getLogger(__name__)

MAX_EVENTS_PER_SAMPLE = 256  # bounded drain: a storm of XIDs must not stall the metrics loop
_PROFILE_NAME = re.compile(r"(\d+)g\.(\d+(?:\.\d+)?)gb(\S*)")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no driver, no library, no pynvml); the message says why."""


def load_pynvml() -> Any:
    try:
        import pynvml  # noqa: PLC0415 - lazy: the simulated agent must run where nvidia-ml-py is absent
    except ImportError:
        raise NvmlUnavailable("the pynvml module is not installed (pip install nvidia-ml-py)") from None
    return pynvml


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


@dataclass(frozen=True)
class NvmlProfile:
    """One GPU instance profile as this GPU's driver reports it."""

    name: str  # "3g.40gb", "1g.10gb+me"
    index: int  # NVML_GPU_INSTANCE_PROFILE_* (what nvmlDeviceGetGpuInstanceProfileInfo takes)
    id: int  # the profile id (what create / get-instances take); differs from index
    compute_slices: int  # sliceCount
    memory_slices: int  # placement size
    memory_gb: float
    starts: tuple[int, ...]
    max_count: int  # instanceCount
    media_extensions: bool

    def to_dict(self) -> dict:
        return {"name": self.name, "compute_slices": self.compute_slices, "memory_slices": self.memory_slices,
                "memory_gb": self.memory_gb, "starts": list(self.starts), "max_count": self.max_count,
                "media_extensions": self.media_extensions, "nvml_profile": self.index}


@dataclass
class NvmlGpu:
    uuid: str
    index: int
    handle: Any
    name: str
    memory_mib: int
    mig_enabled: bool
    profiles: dict[str, NvmlProfile]


class NvmlBackend(Backend):
    name = "nvml"

    def __init__(self, *, nvml: Any = None, hostname: str | None = None):
        self.nv = nv = nvml if nvml is not None else load_pynvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError_LibraryNotFound:
            raise NvmlUnavailable("NVIDIA driver library not found") from None
        except nv.NVMLError_DriverNotLoaded:
            raise NvmlUnavailable("the NVIDIA driver is not loaded") from None
        except nv.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from None
        self.hostname = hostname or socket.gethostname()
        # One lock for MIG changes and sampling: a create and a destroy on one GPU must not interleave.
        self._lock = threading.RLock()
        self.driver_version = _text(nv.nvmlSystemGetDriverVersion())
        cuda = int(nv.nvmlSystemGetCudaDriverVersion())  # 12040 -> "12.4"
        self.cuda_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        self._gpus = [self._read_gpu(i) for i in range(nv.nvmlDeviceGetCount())]
        self._event_set = self._register_xid_events()

    # --- discovery -----------------------------------------------------------------------------------

    def _read_gpu(self, index: int) -> NvmlGpu:
        nv = self.nv
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
            mig_enabled = current == nv.NVML_DEVICE_MIG_ENABLE
        except nv.NVMLError_NotSupported:
            mig_enabled = False
        name = _text(nv.nvmlDeviceGetName(handle))
        memory_mib = int(nv.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20)
        return NvmlGpu(
            uuid=_text(nv.nvmlDeviceGetUUID(handle)),
            index=index,
            handle=handle,
            name=name,
            memory_mib=memory_mib,
            mig_enabled=mig_enabled,
            profiles=self._read_profiles(handle, catalog.key_for_gpu(name, memory_mib)) if mig_enabled else {},
        )

    def _read_profiles(self, handle: Any, model_key: str | None) -> dict[str, NvmlProfile]:
        nv = self.nv
        offered = []
        for index in range(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 10)):
            try:
                info = self._versioned(nv.nvmlDeviceGetGpuInstanceProfileInfo, handle, index)
            except nv.NVMLError:
                continue  # this GPU does not offer the profile (NotSupported / InvalidArgument)
            placements = self._possible_placements(handle, info.id)
            if placements and info.instanceCount:
                offered.append((index, info, placements))
        total_slices = max((s + size for _, _, pl in offered for s, size in pl), default=0)
        model_gb = catalog.GPU_MODELS[model_key].memory_gb if model_key else None
        profiles: dict[str, NvmlProfile] = {}
        for index, info, placements in offered:
            size = int(placements[0][1])
            nominal = model_gb * size / total_slices if model_gb else None
            name, memory_gb = self._profile_name(info, index, nominal)
            profiles[name] = NvmlProfile(
                name=name, index=index, id=int(info.id), compute_slices=int(info.sliceCount),
                memory_slices=size, memory_gb=memory_gb,
                starts=tuple(sorted(start for start, _ in placements)), max_count=int(info.instanceCount),
                media_extensions=name.endswith("+me") or "+me." in name)
        return profiles

    def _versioned(self, fn: Any, *args: Any) -> Any:
        """Call an NVML *ProfileInfo function as V2 (has the profile name), falling back to V1 on old
        drivers that lack the V symbol."""
        try:
            return fn(*args)
        except self.nv.NVMLError_FunctionNotFound:
            return fn(*args, version=1)

    def _possible_placements(self, handle: Any, profile_id: int) -> list[tuple[int, int]]:
        nv = self.nv
        count = ctypes.c_uint(0)
        try:  # first call with no array asks for the count (NVML's two-call pattern)
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
            array = (nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
            count = ctypes.c_uint(len(array))
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
        except nv.NVMLError:
            return []
        return [(int(array[i].start), int(array[i].size)) for i in range(count.value)]

    def _profile_name(self, info: Any, index: int, nominal_gb: float | None) -> tuple[str, float]:
        """("3g.40gb", 40.0): NVML's own name when the V2 info has it, else NVIDIA's naming rule."""
        reported = _text(getattr(info, "name", b"") or b"").strip()
        if reported.upper().startswith("MIG "):
            reported = reported[4:].strip()
        match = _PROFILE_NAME.fullmatch(reported)
        if match:
            return reported, float(match.group(2))
        nv = self.nv
        # Names use the board's nominal memory shared by memory slices, rounded half up (H200: 141 GB
        # x 4/8 = 70.5 -> "3g.71gb"), not the usable MiB NVML reports (40192 MB for "3g.40gb").
        raw = nominal_gb if nominal_gb is not None else int(info.memorySizeMB) / 1024
        memory_gb = float(math.floor(raw + 0.5))
        suffix = {getattr(nv, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", -1): "+me",
                  getattr(nv, "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1", -1): "+me",
                  getattr(nv, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME", -1): "+me.all",
                  getattr(nv, "NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME", -1): "+me.all",
                  getattr(nv, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME", -1): "-me",
                  getattr(nv, "NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME", -1): "-me",
                  getattr(nv, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX", -1): "+gfx",
                  getattr(nv, "NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX", -1): "+gfx",
                  getattr(nv, "NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX", -1): "+gfx",
                  }.get(index, "")
        return f"{int(info.sliceCount)}g.{memory_gb:g}gb{suffix}", memory_gb

    def _register_xid_events(self) -> Any:
        nv = self.nv
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.warning("XID events unavailable: %s", exc)
            return None
        for gpu in self._gpus:
            try:
                nv.nvmlDeviceRegisterEvents(gpu.handle, nv.nvmlEventTypeXidCriticalError, event_set)
            except nv.NVMLError as exc:
                log.warning("GPU %s: XID events unavailable: %s", gpu.index, exc)
        return event_set

    # --- lookups -------------------------------------------------------------------------------------

    def _gpu(self, gpu_uuid: str) -> NvmlGpu:
        for gpu in self._gpus:
            if gpu.uuid == gpu_uuid:
                return gpu
        raise not_found(f"no GPU {gpu_uuid} on {self.hostname}")

    def _gpu_instances(self, gpu: NvmlGpu) -> list[tuple[Any, Any, NvmlProfile]]:
        """Every GPU instance on the GPU: (handle, nvmlGpuInstanceGetInfo, profile)."""
        nv = self.nv
        found = []
        for profile in gpu.profiles.values():
            array = (nv.c_nvmlGpuInstance_t * profile.max_count)()
            count = ctypes.c_uint(len(array))
            nv.nvmlDeviceGetGpuInstances(gpu.handle, profile.id, array, ctypes.byref(count))
            for gi in array[:count.value]:
                found.append((gi, nv.nvmlGpuInstanceGetInfo(gi), profile))
        return found

    def _mig_device_uuid(self, gpu: NvmlGpu, gi_id: int) -> str | None:
        """The MIG device UUID (what CUDA_VISIBLE_DEVICES takes) of the GPU instance `gi_id`."""
        nv = self.nv
        for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)):
            try:
                mig_handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, i)
            except nv.NVMLError_NotFound:
                continue
            if nv.nvmlDeviceGetGpuInstanceId(mig_handle) == gi_id:
                return _text(nv.nvmlDeviceGetUUID(mig_handle))
        return None

    def _instance_uuid(self, gpu: NvmlGpu, gi_id: int) -> str:
        # A GPU instance without a compute instance has no MIG device yet; it still holds memory slices,
        # so it is reported under a stable stand-in name that destroy_instance also accepts.
        return self._mig_device_uuid(gpu, gi_id) or f"{gpu.uuid}/gi/{gi_id}"

    def _compute_instances(self, gi: Any) -> list[Any]:
        nv = self.nv
        found = []
        for ci_index in range(getattr(nv, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 8)):
            try:
                info = self._versioned(nv.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, ci_index,
                                       nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except nv.NVMLError:
                continue
            array = (nv.c_nvmlComputeInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(len(array))
            nv.nvmlGpuInstanceGetComputeInstances(gi, info.id, array, ctypes.byref(count))
            found.extend(array[:count.value])
        return found

    # --- Backend -------------------------------------------------------------------------------------

    def inventory(self) -> dict:
        with self._lock:
            gpus = [self._gpu_facts(g) for g in self._gpus]
        return {"hostname": self.hostname, "driver_version": self.driver_version,
                "cuda_version": self.cuda_version, "backend": self.name, "gpus": gpus}

    def _gpu_facts(self, gpu: NvmlGpu) -> dict:
        geometry = None
        instances = []
        if gpu.mig_enabled and gpu.profiles:
            profiles = list(gpu.profiles.values())
            geometry = {
                "memory_slices": max(max(p.starts) + p.memory_slices for p in profiles),
                "compute_slices": max(p.compute_slices for p in profiles),
                "profiles": [p.to_dict() for p in profiles],
            }
            for _gi, info, profile in self._gpu_instances(gpu):
                instances.append({"uuid": self._instance_uuid(gpu, int(info.id)), "profile": profile.name,
                                  "start": int(info.placement.start), "size": int(info.placement.size)})
        return {"uuid": gpu.uuid, "index": gpu.index, "name": gpu.name,
                "model": catalog.key_for_gpu(gpu.name, gpu.memory_mib), "memory_mib": gpu.memory_mib,
                "mig_enabled": gpu.mig_enabled, "mig": geometry, "instances": instances}

    def create_instance(self, gpu_uuid: str, profile: str, start: int) -> dict:
        nv = self.nv
        with self._lock:
            gpu = self._gpu(gpu_uuid)
            if not gpu.mig_enabled:
                raise not_supported(f"GPU {gpu_uuid} does not have MIG mode enabled")
            spec = gpu.profiles.get(profile)
            if spec is None:
                raise BackendError(protocol.E_PLACEMENT, f"GPU {gpu.index} offers no MIG profile {profile!r}; "
                                                         f"it offers {', '.join(gpu.profiles)}")
            placement = nv.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, spec.memory_slices
            # Always with an explicit placement: the driver's default order can refuse a layout that an
            # explicit placement allows (NVIDIA MIG user guide).
            try:
                gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(gpu.handle, spec.id, ctypes.byref(placement))
            except nv.NVMLError as exc:
                raise self._domain_error(exc, f"creating {profile} at slice {start} on GPU {gpu.index}",
                                         hint=f"legal starts: {', '.join(map(str, spec.starts))}") from None
            try:
                ci_profile = self._full_compute_profile(gi, spec.compute_slices)
                nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
                gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
                uuid = self._mig_device_uuid(gpu, gi_id)
                if uuid is None:
                    raise BackendError(protocol.E_INTERNAL, f"no MIG device appeared for GPU instance {gi_id}")
            except BaseException as exc:
                # No half-made instance: a GPU instance without its compute instance holds slices that
                # nothing can use and the server does not know about.
                self._destroy_gpu_instance(gi, quiet=True)
                if isinstance(exc, nv.NVMLError):
                    raise self._domain_error(exc, f"creating the compute instance of {profile} on GPU "
                                                  f"{gpu.index}") from None
                raise
        log.info("created %s at %d on GPU %d: %s", profile, start, gpu.index, uuid)
        return {"instance_uuid": uuid, "gpu_uuid": gpu_uuid, "profile": profile, "start": start,
                "size": spec.memory_slices, "cuda_visible_devices": uuid}

    def _full_compute_profile(self, gi: Any, slices: int) -> Any:
        """The compute instance profile that takes the whole GPU instance (one CI per GI)."""
        nv = self.nv
        index = {1: "1_SLICE", 2: "2_SLICE", 3: "3_SLICE", 4: "4_SLICE", 6: "6_SLICE", 7: "7_SLICE",
                 8: "8_SLICE"}.get(slices)
        if index is None:
            raise not_supported(f"no compute instance profile for {slices} slices")
        return self._versioned(nv.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi,
                               getattr(nv, f"NVML_COMPUTE_INSTANCE_PROFILE_{index}"),
                               nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)

    def _destroy_gpu_instance(self, gi: Any, *, quiet: bool = False) -> None:
        """Compute instances first (the driver refuses to destroy a GI that still has them), then the GI."""
        nv = self.nv
        try:
            for ci in self._compute_instances(gi):
                nv.nvmlComputeInstanceDestroy(ci)
            nv.nvmlGpuInstanceDestroy(gi)
        except nv.NVMLError as exc:
            if not quiet:
                raise
            log.error("could not clean up a half-made GPU instance: %s", exc)

    def destroy_instance(self, gpu_uuid: str, instance_uuid: str) -> dict:
        nv = self.nv
        with self._lock:
            gpu = self._gpu(gpu_uuid)
            for gi, info, _profile in (self._gpu_instances(gpu) if gpu.mig_enabled else []):
                if self._instance_uuid(gpu, int(info.id)) == instance_uuid:
                    try:
                        self._destroy_gpu_instance(gi)
                    except nv.NVMLError as exc:
                        raise self._domain_error(exc, f"destroying {instance_uuid}") from None
                    log.info("destroyed %s on GPU %d", instance_uuid, gpu.index)
                    return {"instance_uuid": instance_uuid, "gpu_uuid": gpu_uuid, "destroyed": True}
        raise not_found(f"no MIG instance {instance_uuid} on GPU {gpu_uuid}")

    def _domain_error(self, exc: Exception, doing: str, hint: str = "") -> BackendError:
        nv = self.nv
        for name, code in (("NVMLError_InsufficientResources", protocol.E_INSUFFICIENT),
                           ("NVMLError_InvalidArgument", protocol.E_PLACEMENT),
                           ("NVMLError_NotSupported", protocol.E_NOT_SUPPORTED),
                           ("NVMLError_NotFound", protocol.E_NOT_FOUND)):
            if isinstance(exc, getattr(nv, name)):
                break
        else:
            code = protocol.E_INTERNAL
        return BackendError(code, f"NVML refused {doing}: {exc}" + (f" ({hint})" if hint else ""))

    # --- metrics -------------------------------------------------------------------------------------

    def _read(self, fn: Any, *args: Any) -> Any:
        """One metric; None where the GPU cannot report it (NotSupported, e.g. utilisation in MIG mode)."""
        nv = self.nv
        try:
            return fn(*args)
        except nv.NVMLError_NotSupported:
            return None
        except nv.NVMLError as exc:
            log.warning("%s failed: %s", getattr(fn, "__name__", fn), exc)
            return None

    def sample(self) -> list[dict]:
        nv = self.nv
        with self._lock:
            xids = self._drain_xids()
            out = []
            for gpu in self._gpus:
                h = gpu.handle
                util = self._read(nv.nvmlDeviceGetUtilizationRates, h)
                memory = self._read(nv.nvmlDeviceGetMemoryInfo, h)
                power_mw = self._read(nv.nvmlDeviceGetPowerUsage, h)
                out.append({
                    "uuid": gpu.uuid,
                    "util": None if util is None else int(util.gpu),
                    "mem_used_mib": None if memory is None else int(memory.used) // (1 << 20),
                    "mem_total_mib": None if memory is None else int(memory.total) // (1 << 20),
                    "temp_c": self._read(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                    "power_w": None if power_mw is None else round(power_mw / 1000.0, 1),
                    "sm_clock_mhz": self._read(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                    "ecc_sbe": self._read(nv.nvmlDeviceGetTotalEccErrors, h,
                                          nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
                    "ecc_dbe": self._read(nv.nvmlDeviceGetTotalEccErrors, h,
                                          nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
                    "xid": xids.get(gpu.uuid, []),
                })
            return out

    def _drain_xids(self) -> dict[str, list[int]]:
        """XID codes waiting in the event set, by GPU uuid; a wait with timeout 0 never blocks."""
        nv = self.nv
        found: dict[str, list[int]] = defaultdict(list)
        if self._event_set is None:
            return found
        known = {g.uuid for g in self._gpus}
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, 0)
            except nv.NVMLError_Timeout:
                break
            except nv.NVMLError as exc:
                log.warning("reading XID events failed: %s", exc)
                break
            if not int(data.eventType) & nv.nvmlEventTypeXidCriticalError:
                continue
            uuid = self._read(nv.nvmlDeviceGetUUID, data.device)
            uuid = _text(uuid) if uuid is not None else None
            if uuid not in known:  # reported against a MIG device: charge its parent GPU
                parent = self._read(nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, data.device)
                uuid = _text(nv.nvmlDeviceGetUUID(parent)) if parent is not None else None
            if uuid in known:
                found[uuid].append(int(data.eventData))
        return found

    def close(self) -> None:
        nv = self.nv
        try:
            if self._event_set is not None:
                nv.nvmlEventSetFree(self._event_set)
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.warning("NVML shutdown: %s", exc)
