"""A fake `pynvml` that behaves like a driver, for testing the NVML backend without a GPU.

Shaped like nvidia-ml-py's module: the same function names and signatures, the same error hierarchy
(`NVMLError(code)` returns the `NVMLError_<Name>` subclass, generated from the NVML_ERROR_* constants the
way pynvml does), the same constants, and struct-like results with the real field names. Calls that take
caller-allocated ctypes arrays and `ctypes.byref(count)` fill them as the C library does.

The fake enforces MIG placement with its own rules table (NVIDIA MIG user guide, H100 80GB), written
independently of `nodeagent.hardware.mig` so the backend is checked against something that is not itself.
Profile ids differ from profile indices, as on real hardware (index 2 = 3-slice has id 9).
"""
from __future__ import annotations

import ctypes
import itertools
import string
import sys
import uuid as uuidlib
from dataclasses import dataclass, field
from types import SimpleNamespace

# --- constants (values as in pynvml / nvml.h) ---------------------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeSingleBitEccError = 0x0000000000000001

NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1
NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_GPU_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0


# --- errors: the same generated hierarchy as pynvml ------------------------------------------------------

class NVMLError(Exception):
    _valClassMapping: dict = {}

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other):
        return self.value == other.value

    __hash__ = Exception.__hash__


_ERROR_TEXT = {NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument", NVML_ERROR_NOT_SUPPORTED: "Not Supported",
               NVML_ERROR_NOT_FOUND: "Not Found", NVML_ERROR_TIMEOUT: "Timeout",
               NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
               NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded", NVML_ERROR_IN_USE: "In use by another client",
               NVML_ERROR_INSUFFICIENT_RESOURCES: "Ran out of critical resources, other than memory",
               NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
               NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found"}


def _extract_errors_as_classes() -> None:
    """NVML_ERROR_ALREADY_INITIALIZED -> NVMLError_AlreadyInitialized, as pynvml generates them."""
    this = sys.modules[__name__]
    for err_name in [x for x in dir(this) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        err_val = getattr(this, err_name)

        def gen_new(val):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)
            return new

        cls = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        cls.__module__ = __name__
        setattr(this, class_name, cls)
        NVMLError._valClassMapping[err_val] = cls


_extract_errors_as_classes()


# --- structs --------------------------------------------------------------------------------------------

class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


# The real handle types are opaque pointers; the fake's handles are small integers, which c_void_p arrays
# hold just as the real arrays hold pointers.
c_nvmlGpuInstance_t = ctypes.c_void_p
c_nvmlComputeInstance_t = ctypes.c_void_p


def _deref(ref):
    """The object behind ctypes.byref(x) or ctypes.pointer(x)."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    return ref


# --- the rules table --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProfileRule:
    index: int
    id: int
    name: str
    slices: int  # compute slices (sliceCount)
    memory_mb: int
    instance_count: int
    starts: tuple[int, ...]
    size: int  # memory slices
    media: bool = False


# H100 80GB (NVIDIA MIG user guide, "H100 MIG profiles"); ids as `nvidia-smi mig -lgip` prints them.
H100_80GB = (
    ProfileRule(0x0, 19, "1g.10gb", 1, 9856, 7, (0, 1, 2, 3, 4, 5, 6), 1),
    ProfileRule(0x7, 20, "1g.10gb+me", 1, 9856, 1, (0, 1, 2, 3, 4, 5, 6), 1, media=True),
    ProfileRule(0x9, 15, "1g.20gb", 1, 19968, 4, (0, 2, 4, 6), 2),
    ProfileRule(0x1, 14, "2g.20gb", 2, 19968, 3, (0, 2, 4), 2),
    ProfileRule(0x2, 9, "3g.40gb", 3, 40192, 2, (0, 4), 4),
    ProfileRule(0x3, 5, "4g.40gb", 4, 40192, 1, (0,), 4),
    ProfileRule(0x4, 0, "7g.80gb", 7, 80384, 1, (0,), 8),
)
COMPUTE_SLICES_H100 = 7
CI_SLICES = {NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1, NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
             NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3, NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
             NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7}


@dataclass
class FakeGi:
    handle: int
    id: int
    rule: ProfileRule
    start: int
    device: "FakeGpu"
    cis: dict = field(default_factory=dict)  # handle -> ci profile index
    mig_uuid: str | None = None


@dataclass
class FakeGpu:
    name: str
    memory_mib: int
    rules: tuple[ProfileRule, ...] | None = None  # None: no MIG (e.g. an L4)
    mig_enabled: bool = False
    uuid: str = field(default_factory=lambda: "GPU-" + str(uuidlib.uuid4()))
    unsupported: set = field(default_factory=set)  # function names that raise NotSupported here
    temp_c: int = 36
    power_mw: int = 71234
    util: int = 4
    mem_used_mib: int = 600
    sm_clock_mhz: int = 1755
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    gis: dict = field(default_factory=dict)  # gi handle -> FakeGi

    @classmethod
    def h100(cls, *, mig_enabled: bool = True) -> "FakeGpu":
        return cls("NVIDIA H100 80GB HBM3", 81559, H100_80GB, mig_enabled)

    @classmethod
    def l4(cls) -> "FakeGpu":
        return cls("NVIDIA L4", 23034)


@dataclass
class FakeMigDevice:
    parent: FakeGpu
    gi: FakeGi


class FakeEventSet:
    def __init__(self):
        self.devices: set[int] = set()
        self.queue: list = []


# --- the module-shaped fake ------------------------------------------------------------------------------

class FakePynvml:
    """Use in place of the `pynvml` module: functions are methods, constants and errors are attributes."""

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None, driver: str = "550.54.15",
                 cuda: int = 12040, v2_profile_info: bool = True):
        self.gpus = gpus
        self.init_error = init_error
        self.driver = driver
        self.cuda = cuda
        self.v2_profile_info = v2_profile_info
        self.initialized = False
        self.calls: list[str] = []
        self._failures: dict[str, int] = {}
        self._handles = itertools.count(1)
        self._gi_ids = itertools.count(1)
        self._event_sets: list[FakeEventSet] = []

    def __getattr__(self, name):  # constants, error classes, struct types: from the module
        try:
            return globals()[name]
        except KeyError:
            raise AttributeError(name) from None

    # test controls
    def fail_next(self, function: str, code: int) -> None:
        """The next call of `function` raises NVMLError(code)."""
        self._failures[function] = code

    def emit_xid(self, gpu: FakeGpu, code: int) -> None:
        index = self.gpus.index(gpu)
        for es in self._event_sets:
            if index in es.devices:
                es.queue.append(SimpleNamespace(device=gpu, eventType=nvmlEventTypeXidCriticalError,
                                                eventData=code, gpuInstanceId=0xFFFFFFFF,
                                                computeInstanceId=0xFFFFFFFF))

    def all_gpu_instances(self) -> list[FakeGi]:
        return [gi for g in self.gpus for gi in g.gis.values()]

    def _enter(self, name: str, *, needs_init: bool = True) -> None:
        self.calls.append(name)
        code = self._failures.pop(name, None)
        if code is not None:
            raise NVMLError(code)
        if needs_init and not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _device(self, handle) -> FakeGpu:
        if not isinstance(handle, FakeGpu):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if handle.unsupported and self.calls[-1] in handle.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle

    def _gi(self, handle) -> FakeGi:
        for g in self.gpus:
            if handle in g.gis:
                return g.gis[handle]
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    @staticmethod
    def _rule_by_id(gpu: FakeGpu, profile_id: int) -> ProfileRule:
        for rule in gpu.rules or ():
            if rule.id == profile_id:
                return rule
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    # init / system
    def nvmlInit(self):
        self._enter("nvmlInit", needs_init=False)
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self):
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self):
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    # devices
    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle):
        self._enter("nvmlDeviceGetName")
        return self._device(handle).name

    def nvmlDeviceGetUUID(self, handle):
        self._enter("nvmlDeviceGetUUID")
        if isinstance(handle, FakeMigDevice):
            return handle.gi.mig_uuid
        return self._device(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        self._enter("nvmlDeviceGetMemoryInfo")
        g = self._device(handle)
        total = g.memory_mib << 20
        used = g.mem_used_mib << 20
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetMigMode(self, device):
        self._enter("nvmlDeviceGetMigMode")
        g = self._device(device)
        if g.rules is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if g.mig_enabled else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    # MIG: GPU instances
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device, profile, version=2):
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo")
        g = self._device(device)
        if version == 2 and not self.v2_profile_info:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if g.rules is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        for rule in g.rules:
            if rule.index == profile:
                info = SimpleNamespace(id=rule.id, isP2pSupported=0, sliceCount=rule.slices,
                                       instanceCount=rule.instance_count,
                                       multiprocessorCount=rule.slices * 16, copyEngineCount=rule.slices,
                                       decoderCount=1 if rule.media else 0, encoderCount=0,
                                       jpegCount=1 if rule.media else 0, ofaCount=1 if rule.media else 0,
                                       memorySizeMB=rule.memory_mb)
                if version == 2:
                    info.version = 0x02000098
                    info.name = f"MIG {rule.name}".encode()
                return info
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, device, profileId, placementsRef, countRef):
        self._enter("nvmlDeviceGetGpuInstancePossiblePlacements")
        rule = self._rule_by_id(self._device(device), profileId)
        count = _deref(countRef)
        if placementsRef is None:
            count.value = len(rule.starts)
            return NVML_SUCCESS
        if count.value < len(rule.starts):
            count.value = len(rule.starts)
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(rule.starts):
            placementsRef[i].start, placementsRef[i].size = start, rule.size
        count.value = len(rule.starts)
        return NVML_SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device, profileId, placement):
        self._enter("nvmlDeviceCreateGpuInstanceWithPlacement")
        g = self._device(device)
        if not g.mig_enabled:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        rule = self._rule_by_id(g, profileId)
        p = _deref(placement)
        if p.size != rule.size or p.start not in rule.starts:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        want = set(range(p.start, p.start + p.size))
        for gi in g.gis.values():
            if want & set(range(gi.start, gi.start + gi.rule.size)):
                raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        same = [gi for gi in g.gis.values() if gi.rule.id == rule.id]
        compute = sum(gi.rule.slices for gi in g.gis.values())
        media = any(gi.rule.media for gi in g.gis.values())
        if (len(same) >= rule.instance_count or compute + rule.slices > COMPUTE_SLICES_H100
                or (rule.media and media)):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        handle = next(self._handles)
        g.gis[handle] = FakeGi(handle=handle, id=next(self._gi_ids), rule=rule, start=p.start, device=g)
        return handle

    def nvmlGpuInstanceDestroy(self, gpuInstance):
        self._enter("nvmlGpuInstanceDestroy")
        gi = self._gi(gpuInstance)
        if gi.cis:
            raise NVMLError(NVML_ERROR_IN_USE)
        del gi.device.gis[gpuInstance]
        return NVML_SUCCESS

    def nvmlDeviceGetGpuInstances(self, device, profileId, gpuInstancesRef, countRef):
        self._enter("nvmlDeviceGetGpuInstances")
        g = self._device(device)
        self._rule_by_id(g, profileId)
        found = [gi for gi in g.gis.values() if gi.rule.id == profileId]
        count = _deref(countRef)
        if count.value < len(found):
            count.value = len(found)
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, gi in enumerate(found):
            gpuInstancesRef[i] = gi.handle
        count.value = len(found)
        return NVML_SUCCESS

    def nvmlGpuInstanceGetInfo(self, gpuInstance):
        self._enter("nvmlGpuInstanceGetInfo")
        gi = self._gi(gpuInstance)
        return SimpleNamespace(device=gi.device, id=gi.id, profileId=gi.rule.id,
                               placement=c_nvmlGpuInstancePlacement_t(gi.start, gi.rule.size))

    # MIG: compute instances
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, device, profile, engProfile, version=2):
        self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo")
        if version == 2 and not self.v2_profile_info:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        gi = self._gi(device)  # pynvml names the first argument `device`; it is the GPU instance
        slices = CI_SLICES.get(profile)
        if slices is None or slices > gi.rule.slices or engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=profile, sliceCount=slices, instanceCount=gi.rule.slices // slices,
                               multiprocessorCount=slices * 16, sharedCopyEngineCount=gi.rule.slices,
                               sharedDecoderCount=0, sharedEncoderCount=0, sharedJpegCount=0, sharedOfaCount=0)

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance, profileId):
        self._enter("nvmlGpuInstanceCreateComputeInstance")
        gi = self._gi(gpuInstance)
        slices = CI_SLICES.get(profileId)
        if slices is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if sum(CI_SLICES[p] for p in gi.cis.values()) + slices > gi.rule.slices:
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        handle = next(self._handles)
        gi.cis[handle] = profileId
        if gi.mig_uuid is None:
            gi.mig_uuid = "MIG-" + str(uuidlib.uuid4())
        return handle

    def nvmlComputeInstanceDestroy(self, computeInstance):
        self._enter("nvmlComputeInstanceDestroy")
        for gi in self.all_gpu_instances():
            if computeInstance in gi.cis:
                del gi.cis[computeInstance]
                if not gi.cis:
                    gi.mig_uuid = None
                return NVML_SUCCESS
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpuInstanceGetComputeInstances(self, gpuInstance, profileId, computeInstancesRef, countRef):
        self._enter("nvmlGpuInstanceGetComputeInstances")
        gi = self._gi(gpuInstance)
        found = [h for h, p in gi.cis.items() if p == profileId]
        count = _deref(countRef)
        if count.value < len(found):
            count.value = len(found)
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, h in enumerate(found):
            computeInstancesRef[i] = h
        count.value = len(found)
        return NVML_SUCCESS

    # MIG devices
    def nvmlDeviceGetMaxMigDeviceCount(self, device):
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        return 7 if self._device(device).mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index):
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        g = self._device(device)
        if not 0 <= index < 7:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        devices = sorted((gi for gi in g.gis.values() if gi.cis), key=lambda gi: gi.id)
        if index >= len(devices):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return FakeMigDevice(g, devices[index])

    def nvmlDeviceGetGpuInstanceId(self, device):
        self._enter("nvmlDeviceGetGpuInstanceId")
        if not isinstance(device, FakeMigDevice):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return device.gi.id

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice):
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        if not isinstance(migDevice, FakeMigDevice):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return migDevice.parent

    # metrics
    def nvmlDeviceGetUtilizationRates(self, handle):
        self._enter("nvmlDeviceGetUtilizationRates")
        g = self._device(handle)
        if g.mig_enabled:  # the real driver does not report whole-GPU utilisation in MIG mode
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=g.util, memory=g.util // 2)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self._enter("nvmlDeviceGetTemperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._device(handle).temp_c

    def nvmlDeviceGetPowerUsage(self, handle):
        self._enter("nvmlDeviceGetPowerUsage")
        return self._device(handle).power_mw

    def nvmlDeviceGetClockInfo(self, handle, type):
        self._enter("nvmlDeviceGetClockInfo")
        if type != NVML_CLOCK_SM:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._device(handle).sm_clock_mhz

    def nvmlDeviceGetTotalEccErrors(self, handle, errorType, counterType):
        self._enter("nvmlDeviceGetTotalEccErrors")
        g = self._device(handle)
        return g.ecc_sbe if errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED else g.ecc_dbe

    # events
    def nvmlEventSetCreate(self):
        self._enter("nvmlEventSetCreate")
        es = FakeEventSet()
        self._event_sets.append(es)
        return es

    def nvmlDeviceRegisterEvents(self, handle, eventTypes, eventSet):
        self._enter("nvmlDeviceRegisterEvents")
        g = self._device(handle)
        if eventTypes & nvmlEventTypeXidCriticalError:
            eventSet.devices.add(self.gpus.index(g))

    def nvmlEventSetWait_v2(self, eventSet, timeoutms):
        self._enter("nvmlEventSetWait_v2")
        if not eventSet.queue:
            raise NVMLError(NVML_ERROR_TIMEOUT)  # what the real call raises when nothing arrived in time
        return eventSet.queue.pop(0)

    def nvmlEventSetWait(self, eventSet, timeoutms):
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet):
        self._enter("nvmlEventSetFree")
        self._event_sets.remove(eventSet)
