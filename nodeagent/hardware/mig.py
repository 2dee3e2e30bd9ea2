"""MIG geometry: the one source of truth for where NVIDIA MIG GPU instances may go.

Pure Python (no Django): used by the scheduler core, the simulator, the simulated agent backend and the
server when it checks what an agent reports.

Model of the hardware (NVIDIA MIG user guide, "Supported MIG profiles" and "placements"):
- a GPU has N memory slices (8 on A100/H100/H200/H20/B200, 4 on A30) and C compute slices (7, or 4 on A30);
- a profile takes `memory_slices` consecutive memory slices starting at one of its legal `starts`
  (a 3g on an 8-slice GPU may start at 0 or 4 only) and `compute_slices` compute slices;
- instances never share a memory slice, the sum of compute slices never passes C, and each profile has a
  maximum count per GPU; "+me" profiles take the GPU's media engines, so at most one of them exists.
Creating instances in the driver's default order can fail where an explicit placement succeeds, which is
why every decision here is a (profile, start) pair.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence


@dataclass(frozen=True)
class MigProfile:
    name: str  # "3g.40gb"
    compute_slices: int
    memory_slices: int  # the placement size
    memory_gb: float
    starts: tuple[int, ...]  # legal start memory slices
    max_count: int
    media_extensions: bool = False  # "+me": owns the GPU's media engines (NVDEC/NVJPG/OFA)
    nvml_profile: int | None = None  # NVML_GPU_INSTANCE_PROFILE_* index where known

    @property
    def size(self) -> int:
        return self.memory_slices

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "compute_slices": self.compute_slices,
            "memory_slices": self.memory_slices,
            "memory_gb": self.memory_gb,
            "starts": list(self.starts),
            "max_count": self.max_count,
            "media_extensions": self.media_extensions,
            "nvml_profile": self.nvml_profile,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "MigProfile":
        return cls(
            name=str(data["name"]),
            compute_slices=int(data["compute_slices"]),
            memory_slices=int(data["memory_slices"]),
            memory_gb=float(data["memory_gb"]),
            starts=tuple(int(s) for s in data["starts"]),
            max_count=int(data["max_count"]),
            media_extensions=bool(data.get("media_extensions", False)),
            nvml_profile=None if data.get("nvml_profile") is None else int(data["nvml_profile"]),
        )


@dataclass(frozen=True)
class Instance:
    """A GPU instance on a GPU: which profile and where it starts (its memory slices)."""

    profile: str
    start: int


@dataclass(frozen=True)
class MigGeometry:
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]
    _by_name: dict = field(default=None, compare=False, repr=False, hash=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {p.name: p for p in self.profiles})
        for p in self.profiles:
            for s in p.starts:
                if s < 0 or s + p.memory_slices > self.memory_slices:
                    raise ValueError(f"profile {p.name}: start {s} + size {p.memory_slices} "
                                     f"passes the GPU's {self.memory_slices} memory slices")

    def profile(self, name: str) -> MigProfile:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"unknown MIG profile {name!r}; known: {', '.join(self._by_name)}") from None

    def has_profile(self, name: str) -> bool:
        return name in self._by_name

    @property
    def full_profile(self) -> MigProfile:
        """The profile that takes the whole GPU (7g on A100/H100, 4g on A30)."""
        return max(self.profiles, key=lambda p: (p.memory_slices, p.compute_slices))

    def to_dict(self) -> dict:
        return {
            "memory_slices": self.memory_slices,
            "compute_slices": self.compute_slices,
            "profiles": [p.to_dict() for p in self.profiles],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "MigGeometry":
        return cls(
            memory_slices=int(data["memory_slices"]),
            compute_slices=int(data["compute_slices"]),
            profiles=tuple(MigProfile.from_dict(p) for p in data["profiles"]),
        )


def occupancy(geometry: MigGeometry, instances: Sequence[Instance]) -> list[int | None]:
    """Memory-slice map: for each slice, the index in `instances` of the instance holding it, or None.

    Assumes a legal layout; where instances overlap, the later one wins (see `layout_problems`).
    """
    slots: list[int | None] = [None] * geometry.memory_slices
    for i, inst in enumerate(instances):
        p = geometry.profile(inst.profile)
        for s in range(inst.start, min(inst.start + p.memory_slices, geometry.memory_slices)):
            slots[s] = i
    return slots


def used_mask(geometry: MigGeometry, instances: Iterable[Instance]) -> int:
    """Bit i set = memory slice i is held by some instance."""
    mask = 0
    for inst in instances:
        p = geometry.profile(inst.profile)
        mask |= ((1 << p.memory_slices) - 1) << inst.start
    return mask


def compute_used(geometry: MigGeometry, instances: Iterable[Instance]) -> int:
    return sum(geometry.profile(i.profile).compute_slices for i in instances)


def why_not(geometry: MigGeometry, instances: Sequence[Instance], profile: str, start: int) -> str | None:
    """None if `profile` may be created at `start` next to `instances`, else the reason in words."""
    if not geometry.has_profile(profile):
        return f"unknown MIG profile {profile!r}"
    p = geometry.profile(profile)
    if start not in p.starts:
        return (f"{p.name} cannot start at memory slice {start}; "
                f"legal starts are {', '.join(map(str, p.starts))}")
    want = ((1 << p.memory_slices) - 1) << start
    for inst in instances:
        q = geometry.profile(inst.profile)
        theirs = ((1 << q.memory_slices) - 1) << inst.start
        if want & theirs:
            return (f"{p.name} at {start} (slices {start}-{start + p.memory_slices - 1}) overlaps "
                    f"{q.name} at {inst.start} (slices {inst.start}-{inst.start + q.memory_slices - 1})")
    same = sum(1 for i in instances if i.profile == p.name)
    if same >= p.max_count:
        return f"{p.name} is limited to {p.max_count} per GPU and {same} exist"
    used = compute_used(geometry, instances)
    if used + p.compute_slices > geometry.compute_slices:
        return (f"{p.name} needs {p.compute_slices} compute slices but only "
                f"{geometry.compute_slices - used} of {geometry.compute_slices} are free")
    if p.media_extensions and any(geometry.profile(i.profile).media_extensions for i in instances):
        return f"{p.name} needs the media engines, which another +me instance holds"
    return None


def legal_starts(geometry: MigGeometry, instances: Sequence[Instance], profile: str) -> list[int]:
    """Every start slot where `profile` may be created now, in ascending order."""
    if not geometry.has_profile(profile):
        return []
    return [s for s in geometry.profile(profile).starts if why_not(geometry, instances, profile, s) is None]


def layout_problems(geometry: MigGeometry, instances: Sequence[Instance]) -> list[str]:
    """Reasons why an existing layout is not legal (empty when it is): used to check agent reports."""
    problems: list[str] = []
    placed: list[Instance] = []
    for inst in instances:
        reason = why_not(geometry, placed, inst.profile, inst.start)
        if reason:
            problems.append(reason)
        else:
            placed.append(inst)
    return problems


def free_capacity(geometry: MigGeometry, instances: Sequence[Instance]) -> tuple[int, int]:
    """(free memory slices, free compute slices)."""
    mask = used_mask(geometry, instances)
    free_mem = geometry.memory_slices - bin(mask).count("1")
    return free_mem, geometry.compute_slices - compute_used(geometry, instances)


def smallest_fitting_profile(geometry: MigGeometry, *, memory_gb: float, compute_slices: int = 1,
                             media_extensions: bool = False) -> MigProfile | None:
    """The cheapest profile (fewest memory, then compute slices) with enough memory and compute."""
    fits = [p for p in geometry.profiles
            if p.memory_gb >= memory_gb and p.compute_slices >= compute_slices
            and p.media_extensions == media_extensions]
    if not fits:
        return None
    return min(fits, key=lambda p: (p.memory_slices, p.compute_slices, p.memory_gb, p.name))


# --- NVIDIA's geometries -------------------------------------------------------------------------

# NVML_GPU_INSTANCE_PROFILE_* indices (nvml.h): 1_SLICE=0, 2_SLICE=1, 3_SLICE=2, 4_SLICE=3, 7_SLICE=4,
# 8_SLICE=5, 6_SLICE=6, 1_SLICE_REV1=7 (+me), 2_SLICE_REV1=8 (+me), 1_SLICE_REV2=9 (1g, double memory).
NVML_1_SLICE, NVML_2_SLICE, NVML_3_SLICE, NVML_4_SLICE, NVML_7_SLICE = 0, 1, 2, 3, 4
NVML_1_SLICE_REV1, NVML_2_SLICE_REV1, NVML_1_SLICE_REV2 = 7, 8, 9


def _eight_slice(mem_1g: float, mem_1g2: float, mem_2g: float, mem_3g: float, mem_4g: float,
                 mem_7g: float) -> MigGeometry:
    """A100 / H100 / H200 / H20 / B200 family: 8 memory slices, 7 compute slices."""
    def gb(x: float) -> str:
        return f"{x:g}gb"

    return MigGeometry(
        memory_slices=8,
        compute_slices=7,
        profiles=(
            MigProfile(f"1g.{gb(mem_1g)}", 1, 1, mem_1g, (0, 1, 2, 3, 4, 5, 6), 7, False, NVML_1_SLICE),
            MigProfile(f"1g.{gb(mem_1g)}+me", 1, 1, mem_1g, (0, 1, 2, 3, 4, 5, 6), 1, True,
                       NVML_1_SLICE_REV1),
            MigProfile(f"1g.{gb(mem_1g2)}", 1, 2, mem_1g2, (0, 2, 4, 6), 4, False, NVML_1_SLICE_REV2),
            MigProfile(f"2g.{gb(mem_2g)}", 2, 2, mem_2g, (0, 2, 4), 3, False, NVML_2_SLICE),
            MigProfile(f"3g.{gb(mem_3g)}", 3, 4, mem_3g, (0, 4), 2, False, NVML_3_SLICE),
            MigProfile(f"4g.{gb(mem_4g)}", 4, 4, mem_4g, (0,), 1, False, NVML_4_SLICE),
            MigProfile(f"7g.{gb(mem_7g)}", 7, 8, mem_7g, (0,), 1, False, NVML_7_SLICE),
        ),
    )


A100_40GB = _eight_slice(5, 10, 10, 20, 20, 40)
A100_80GB = _eight_slice(10, 20, 20, 40, 40, 80)
H100_80GB = _eight_slice(10, 20, 20, 40, 40, 80)
H100_NVL_94GB = _eight_slice(12, 24, 24, 47, 47, 94)
H200_141GB = _eight_slice(18, 35, 35, 71, 71, 141)
# H800-80GB: the export H100; NVIDIA's mig-parted default config lists "H100-80GB, H800-80GB" under the same
# profiles (1g.10gb x7 ... 7g.80gb), so it is the H100's geometry exactly.
H800_80GB = _eight_slice(10, 20, 20, 40, 40, 80)
# H20 96GB: NVIDIA AI Enterprise vGPU reference, "MIG-Backed NVIDIA vGPU for Compute for NVIDIA H20 SXM5 96GB":
# 1g.12gb x7, 1g.12gb+me x1, 1g.24gb x4, 2g.24gb x3, 3g.48gb x2, 4g.48gb x1, 7g.96gb x1 (the H100-96GB set).
H20_96GB = _eight_slice(12, 24, 24, 48, 48, 96)
# B200 180GB: NVIDIA MIG user guide (R580), "Supported MIG Profiles", table "GPU Instance Profiles on B200":
# memory fractions 1/8, 2/8, 4/8, full and SM fractions 1/7 .. 7/7 with instance counts 7, 1 (+me), 4, 3, 2, 1,
# 1: the same 8-memory-slice / 7-compute-slice lattice as A100/H100/H200. The guide's tables give no starts for
# H20 or B200: they are taken to be the A100/H100 placements, which these sizes and counts imply on 8 slices
# (not read from a real board here; `nvidia-smi mig -lgipp` on one would confirm them).
B200_180GB = _eight_slice(23, 45, 45, 90, 90, 180)
A30_24GB = MigGeometry(
    memory_slices=4,
    compute_slices=4,
    profiles=(
        MigProfile("1g.6gb", 1, 1, 6, (0, 1, 2, 3), 4, False, NVML_1_SLICE),
        MigProfile("1g.6gb+me", 1, 1, 6, (0, 1, 2, 3), 1, True, NVML_1_SLICE_REV1),
        MigProfile("2g.12gb", 2, 2, 12, (0, 2), 2, False, NVML_2_SLICE),
        MigProfile("2g.12gb+me", 2, 2, 12, (0, 2), 1, True, NVML_2_SLICE_REV1),
        MigProfile("4g.24gb", 4, 4, 24, (0,), 1, False, NVML_4_SLICE),
    ),
)
