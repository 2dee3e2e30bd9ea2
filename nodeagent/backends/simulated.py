"""A simulated GPU server: the catalog's models, NVIDIA's MIG rules, and believable metrics, in memory.

Like real GPUs, it keeps its MIG instances when the agent dies, given a state file (`--state-file`,
nodeagent/sim_state.py): a restarted agent finds them and reports them in its hello. Carving may be made to take
time (`create_seconds`: the instance exists from the start, the answer comes at the end), which opens the window
between a create_instance and its answer that a fault test kills the agent in.

Used by the demo (several agents on one laptop) and by tests. The MIG rules are not re-implemented here:
`nodeagent.hardware.mig` (the same geometry the scheduler plans with) decides what may be created where, so
the simulated driver refuses exactly what the scheduler would never ask for.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import socket
import threading
import time
import uuid as uuidlib
from dataclasses import asdict, dataclass, field

from nodeagent.hardware import gpus as catalog
from nodeagent.hardware import mig

from .. import protocol
from ..errors import BackendError, not_found, not_supported
from ..sim_state import StateFile
from .base import Backend
from .sim_metrics import GpuMetricState

SIM_DRIVER_VERSION = "550.54.15"
SIM_CUDA_VERSION = "12.4"
FAULTS = ("overheat", "power", "ecc", "xid", "clear")
log = logging.getLogger(__name__)


class SimulateSpecError(ValueError):
    """A --simulate value that does not parse; the message says what is wrong."""


def parse_simulate_spec(text: str) -> list[tuple[str, int]]:
    """"h100-80gb:8,l4:2" -> [("h100-80gb", 8), ("l4", 2)]; strict: unknown model or bad count raises."""
    if not text or not text.strip():
        raise SimulateSpecError("empty --simulate value; expected MODEL:COUNT[,MODEL:COUNT...]")
    result: list[tuple[str, int]] = []
    for item in text.split(","):
        item = item.strip()
        key, sep, count_text = item.partition(":")
        key = key.strip().lower()
        if not key:
            raise SimulateSpecError(f"missing model in {item!r}; expected MODEL:COUNT")
        if key not in catalog.GPU_MODELS:
            raise SimulateSpecError(f"unknown GPU model {key!r}; known: {', '.join(catalog.GPU_MODELS)}")
        if any(k == key for k, _ in result):
            raise SimulateSpecError(f"model {key!r} given twice; give each model once with its count")
        count_text = count_text.strip()
        if not sep or not count_text.isdigit() or not 1 <= int(count_text) <= protocol.MAX_GPUS_PER_NODE:
            raise SimulateSpecError(f"bad count in {item!r}: expected {key}:N with N a whole number "
                                    f"from 1 to {protocol.MAX_GPUS_PER_NODE}")
        result.append((key, int(count_text)))
    total = sum(n for _, n in result)
    if total > protocol.MAX_GPUS_PER_NODE:
        raise SimulateSpecError(f"{total} GPUs is more than a node may have ({protocol.MAX_GPUS_PER_NODE})")
    return result


def parse_load(text: str) -> dict[str, float]:
    """A load file's content: one share 0..1 for everything the machine runs ("0.9"), or a JSON object of shares
    by GPU or MIG instance UUID with "*" for the rest ({"*": 0.1, "MIG-...": 0.95}). ValueError when malformed."""
    text = text.strip()
    if not text:
        raise ValueError("empty load file")
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"not a share or a JSON object: {text[:40]!r}") from None
    loads = value if isinstance(value, dict) else {"*": value}
    for key, share in loads.items():
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise ValueError(f"the load of {key!r} must be a share 0..1, not {share!r}")
    return {str(k): float(v) for k, v in loads.items()}


@dataclass
class SimInstance:
    uuid: str
    profile: str
    start: int
    busy: float = 0.0


@dataclass
class SimGpu:
    uuid: str
    index: int
    spec: catalog.GpuModelSpec
    metrics: GpuMetricState
    instances: list[SimInstance] = field(default_factory=list)
    busy: float = 0.0  # whole-GPU load, for GPUs without MIG

    @property
    def geometry(self) -> mig.MigGeometry | None:
        return self.spec.mig

    def load(self) -> tuple[float, float]:
        """(compute share busy, memory share busy): each busy instance counts by its slice share."""
        geo = self.geometry
        if geo is None:
            return self.busy, self.busy
        compute = memory = 0.0
        for inst in self.instances:
            p = geo.profile(inst.profile)
            compute += inst.busy * p.compute_slices / geo.compute_slices
            memory += inst.busy * p.memory_slices / geo.memory_slices
        return compute, memory


def _stable_uuid(*parts: object) -> str:
    """A UUID that is the same every time the same node starts: the server recognises its GPUs."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:16]
    return str(uuidlib.UUID(bytes=digest, version=4))


class SimulatedBackend(Backend):
    name = "simulated"

    def __init__(self, spec: str | list[tuple[str, int]], *, hostname: str | None = None,
                 seed: int | None = None, busy_on_create: float = 0.0, state: StateFile | None = None,
                 create_seconds: float = 0.0, load_file: str | None = None):
        """`busy_on_create` (0..1) simulates a buyer's workload: a new instance (or a whole GPU taken by
        a lease) runs at about that load instead of idling until `set_busy`. `state`: where the instances are
        kept across restarts (None: in memory only). `load_file`: a file read again at every sample that drives
        the load over time (`parse_load`): a test makes a running machine busy or idle by writing it."""
        if not 0.0 <= busy_on_create <= 1.0:
            raise ValueError(f"busy_on_create must be a share 0..1, not {busy_on_create!r}")
        self.busy_on_create = busy_on_create
        self.state, self.create_seconds = state, create_seconds
        self.load_file = load_file
        self._load_seen: tuple | None = None  # (mtime_ns, size) of the load file last read
        self._loads: dict[str, float] = {}
        models = parse_simulate_spec(spec) if isinstance(spec, str) else list(spec)
        self.hostname = hostname or socket.gethostname()
        self._rng = random.Random(f"{self.hostname}:{seed}" if seed is not None else None)
        self._lock = threading.Lock()
        self._gpus: list[SimGpu] = []
        for key, count in models:
            model = catalog.model_for(key)
            for _ in range(count):
                index = len(self._gpus)
                state = GpuMetricState(mem_total_mib=model.memory_gb * 1024, tdp_w=model.tdp_w,
                                       rng=random.Random(self._rng.getrandbits(64)))
                self._gpus.append(SimGpu(uuid="GPU-" + _stable_uuid(self.hostname, seed, index, key),
                                         index=index, spec=model, metrics=state))
        self._restore()

    # --- the state kept across restarts ----------------------------------------------------------------

    def _restore(self) -> None:
        """The instances the state file holds for these GPUs (a GPU the spec no longer has is forgotten)."""
        kept = (self.state.load("instances") if self.state else None) or {}
        for gpu in self._gpus:
            if gpu.geometry is not None:
                gpu.instances = [SimInstance(**i) for i in kept.get(gpu.uuid, [])]

    def _persist(self) -> None:
        """Write every GPU's instances (called under the lock, after each change)."""
        if self.state is not None:
            self.state.save("instances", {g.uuid: [asdict(i) for i in g.instances] for g in self._gpus
                                          if g.instances})

    # --- lookups -------------------------------------------------------------------------------------

    def _gpu(self, gpu_uuid: str) -> SimGpu:
        for gpu in self._gpus:
            if gpu.uuid == gpu_uuid:
                return gpu
        raise not_found(f"no GPU {gpu_uuid} on {self.hostname}")

    @staticmethod
    def _instance(gpu: SimGpu, instance_uuid: str) -> SimInstance:
        for inst in gpu.instances:
            if inst.uuid == instance_uuid:
                return inst
        raise not_found(f"no MIG instance {instance_uuid} on GPU {gpu.uuid}")

    # --- Backend -------------------------------------------------------------------------------------

    def inventory(self) -> dict:
        with self._lock:
            gpus = [self._gpu_facts(g) for g in self._gpus]
        return {"hostname": self.hostname, "driver_version": SIM_DRIVER_VERSION,
                "cuda_version": SIM_CUDA_VERSION, "backend": self.name, "gpus": gpus}

    def _gpu_facts(self, gpu: SimGpu) -> dict:
        geo = gpu.geometry
        return {
            "uuid": gpu.uuid,
            "index": gpu.index,
            "name": f"NVIDIA {gpu.spec.name}",
            "model": gpu.spec.key,
            "memory_mib": int(gpu.spec.memory_gb * 1024),
            "mig_enabled": geo is not None,
            "mig": geo.to_dict() if geo else None,
            "instances": [{"uuid": i.uuid, "profile": i.profile, "start": i.start,
                           "size": geo.profile(i.profile).memory_slices} for i in gpu.instances] if geo else [],
        }

    def create_instance(self, gpu_uuid: str, profile: str, start: int) -> dict:
        with self._lock:
            gpu = self._gpu(gpu_uuid)
            geo = gpu.geometry
            if geo is None:
                raise not_supported(f"GPU {gpu_uuid} ({gpu.spec.name}) has no MIG; it is leased whole")
            # Same split as the driver: a profile/start the GPU never allows is an invalid argument,
            # a legal placement that collides with what exists is a lack of resources.
            if not geo.has_profile(profile):
                raise BackendError(protocol.E_PLACEMENT, f"unknown MIG profile {profile!r} on {gpu.spec.name}")
            if start not in geo.profile(profile).starts:
                raise BackendError(protocol.E_PLACEMENT, mig.why_not(geo, [], profile, start) or "bad start")
            existing = [mig.Instance(i.profile, i.start) for i in gpu.instances]
            reason = mig.why_not(geo, existing, profile, start)
            if reason:
                raise BackendError(protocol.E_INSUFFICIENT, reason)
            inst = SimInstance(uuid="MIG-" + str(uuidlib.uuid4()), profile=profile, start=start,
                               busy=self._workload())
            gpu.instances.append(inst)
            self._persist()
        time.sleep(self.create_seconds)  # the driver is still busy; the instance exists already
        return {"instance_uuid": inst.uuid, "gpu_uuid": gpu_uuid, "profile": profile, "start": start,
                "size": geo.profile(profile).memory_slices, "cuda_visible_devices": inst.uuid}

    def _workload(self) -> float:
        """Load of a freshly created instance: workloads differ, so ±20% around busy_on_create."""
        if not self.busy_on_create:
            return 0.0
        return min(1.0, self.busy_on_create * self._rng.uniform(0.8, 1.2))

    def destroy_instance(self, gpu_uuid: str, instance_uuid: str) -> dict:
        with self._lock:
            gpu = self._gpu(gpu_uuid)
            inst = self._instance(gpu, instance_uuid)
            gpu.instances.remove(inst)
            self._persist()
        return {"instance_uuid": instance_uuid, "gpu_uuid": gpu_uuid, "destroyed": True}

    def _read_load_file(self) -> None:
        """Apply the load file (under the lock): read again when it changed; a missing or malformed file keeps the
        loads as they were (a test writing it mid-read must not stop the agent)."""
        try:
            st = os.stat(self.load_file)
        except OSError:
            return
        if (st.st_mtime_ns, st.st_size) != self._load_seen:
            try:
                with open(self.load_file, encoding="utf-8") as f:
                    self._loads = parse_load(f.read())
                self._load_seen = (st.st_mtime_ns, st.st_size)
            except (OSError, ValueError) as exc:
                log.warning("load file %s ignored: %s", self.load_file, exc)
                return
        default = self._loads.get("*")
        for gpu in self._gpus:
            if gpu.geometry is None:
                level = self._loads.get(gpu.uuid, default)
                if level is not None:
                    gpu.busy = level
            for inst in gpu.instances:
                level = self._loads.get(inst.uuid, self._loads.get(gpu.uuid, default))
                if level is not None:
                    inst.busy = level

    def sample(self) -> list[dict]:
        with self._lock:
            if self.load_file:
                self._read_load_file()
            out = []
            for gpu in self._gpus:
                load, mem_share = gpu.load()
                out.append({"uuid": gpu.uuid, **gpu.metrics.step(load, mem_share)})
            return out

    def set_busy(self, gpu_uuid: str, instance_uuid: str, busy: float | bool) -> dict:
        if isinstance(busy, bool):
            level = 1.0 if busy else 0.0
        elif isinstance(busy, (int, float)) and 0.0 <= busy <= 1.0:
            level = float(busy)
        else:
            raise BackendError(protocol.E_BAD_FRAME, f"busy must be true/false or a share 0..1, not {busy!r}")
        with self._lock:
            gpu = self._gpu(gpu_uuid)
            if instance_uuid == gpu_uuid and gpu.geometry is None:
                gpu.busy = level
            else:
                self._instance(gpu, instance_uuid).busy = level
                self._persist()
        return {"gpu_uuid": gpu_uuid, "instance_uuid": instance_uuid, "busy": level}

    def inject_fault(self, gpu_uuid: str, fault: str, xid: int | None = None) -> dict:
        if fault not in FAULTS:
            raise BackendError(protocol.E_BAD_FRAME, f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
        if xid is not None and (isinstance(xid, bool) or not isinstance(xid, int) or xid <= 0):
            raise BackendError(protocol.E_BAD_FRAME, f"xid must be a positive integer, not {xid!r}")
        with self._lock:
            self._gpu(gpu_uuid).metrics.inject(fault, xid)
        return {"gpu_uuid": gpu_uuid, "fault": fault}
