"""Plain data the scheduler core takes and returns (no Django, no behaviour beyond small helpers).

The Django side builds `NodeState`s from the database (a snapshot), the simulator builds them from a trace;
both hand them to `engine.Pool` and ask `engine.Scheduler.decide(request)` for a `Decision`.

Class order for capacity is reserved > on_demand > spot (DESIGN §5): only spot instances are ever
preempted, and spot requests never preempt anything.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from nodeagent.hardware.mig import Instance, MigGeometry

PriorityClass = Literal["reserved", "on_demand", "spot"]
Health = Literal["healthy", "degraded", "cordoned"]

# Higher number = higher class; used to decide who may preempt whom.
CLASS_RANK: dict[str, int] = {"spot": 0, "on_demand": 1, "reserved": 2}


@dataclass
class PlacedInstance:
    """An instance (or whole-GPU allocation) currently on a GPU."""

    profile: str | None  # MIG profile name; None = the whole GPU is allocated (MIG off or unused)
    start: int  # first memory slice (0 for a whole GPU)
    lease_id: str | None = None
    priority: PriorityClass = "on_demand"
    remaining_value: float = 0.0  # money still to be earned from it; preemption removes the cheapest first
    milli: int = 0  # a fractional share of a GPU not in MIG mode, in milli-GPU (1..999); 0: not fractional
    cpu_milli: int = 0  # host CPU (milli-cores) and memory (MiB) its lease holds on the node (counted once per
    memory_mib: int = 0  # lease: on its first GPU)

    def as_mig(self) -> Instance:
        assert self.profile is not None, "a whole-GPU allocation has no MIG instance"
        return Instance(self.profile, self.start)


@dataclass
class GpuState:
    uuid: str
    node_id: str
    model: str  # catalog key, e.g. "h100-80gb" (nodeagent.hardware.gpus.GPU_MODELS)
    geometry: MigGeometry | None  # None = not MIG-capable, or MIG mode off: sold as a whole GPU only
    instances: list[PlacedInstance] = field(default_factory=list)
    health: Health = "healthy"
    reliability: float | None = None  # 0..1, this GPU's own score (core/reliability.py); None: its node's


@dataclass
class NodeState:
    id: str
    region: str
    online: bool = True
    cuda_version: str = "12.4"
    price_per_gpu_hour: float = 2.0  # the provider's base price for one whole GPU-hour (DESIGN §5 "base")
    reliability: float = 0.99  # 0..1, the node's reliability score (core/reliability.py)
    interruption_rate: float = 0.0  # spot interruptions per hour on this node, from history
    gpus: list[GpuState] = field(default_factory=list)
    runs_containers: bool = True  # its agent runs workloads (a container runtime)
    image_allowlist: tuple[str, ...] = ()  # image reference prefixes its provider allows; empty: any
    cpu_milli: int | None = None  # host CPU capacity in milli-cores; None: not modelled (never refuses)
    memory_mib: int | None = None  # host memory capacity in MiB; None: not modelled
    cpu_used: int = 0  # what placed leases hold (kept by the pool from its instances)
    memory_used: int = 0


@dataclass
class Request:
    """What a buyer asks for. Defaults ask for the smallest slice of any model, on demand.

    A slice request (whole_gpu False) gets the smallest MIG profile with `memory_gb` and `compute_slices`
    on a MIG GPU, or a whole GPU where the GPU is not split (non-MIG models, MIG off).
    `gpu_count` > 1 means k whole GPUs on one node and implies `whole_gpu`. `profile` pins the MIG profile
    (a reserved window moving to another GPU keeps the profile it was sold as); `short_notice` prices a
    reserved window booked less than the market's notice ahead (pricing.PriceRules.reserved_short_notice).
    """

    models: frozenset[str] | None = None  # allowed catalog keys; None = any
    memory_gb: float = 0
    compute_slices: int = 1
    whole_gpu: bool = False
    gpu_count: int = 1
    min_cuda: str | None = None  # "12.4"
    min_compute_capability: str | None = None  # "8.0"
    regions: frozenset[str] | None = None  # allowed node regions; None = any
    buyer_region: str | None = None  # where the buyer sits, for the latency score
    mode: PriorityClass = "on_demand"
    max_price_per_hour: float | None = None  # cap for the whole request per hour; for spot, the bid
    priority: int = 0
    lease_id: str | None = None  # recorded on the placed instances so release/preemption can find them
    remaining_value: float = 0.0  # recorded on the placed instances (preemption ordering)
    profile: str | None = None  # this MIG profile exactly (on MIG GPUs that have it), instead of the smallest fit
    short_notice: bool = False
    image: str | None = None  # the container image it runs: the node must run containers and allow it
    gpu_milli: int = 0  # 1..999: a fractional share of one GPU not in MIG mode (time-sliced); 0: not fractional
    cpu_milli: int = 0  # host CPU (milli-cores) and memory (MiB) on the node; checked where the node models them
    memory_mib: int = 0

    @property
    def wants_whole(self) -> bool:
        return self.whole_gpu or self.gpu_count > 1

    @property
    def price_mode(self) -> str:
        """The price class (pricing.MODES) this request is charged in."""
        return "reserved_short_notice" if self.mode == "reserved" and self.short_notice else self.mode


@dataclass(frozen=True)
class Placement:
    node_id: str
    gpu_uuid: str
    profile: str | None  # None = the whole GPU
    start: int
    milli: int = 0  # a fractional share of the GPU in milli-GPU; 0: a MIG instance or the whole GPU


@dataclass
class Decision:
    ok: bool
    placements: list[Placement] = field(default_factory=list)
    score: float = 0.0  # 0..100, the weighted sum of the breakdown
    breakdown: dict[str, float] = field(default_factory=dict)  # plugin -> weighted contribution to score
    reasons: dict[str, int] = field(default_factory=dict)  # when not ok: GPUs refused, counted per reason
    preempt: list[str] = field(default_factory=list)  # lease ids of spot instances to remove first
    considered: int = 0  # GPUs scored (after filters)
    price_per_hour: float = 0.0  # what the placement costs the buyer per hour in the request's mode

    def explain(self) -> str:
        """One line a buyer can read: why it was placed, or why nothing fitted."""
        if self.ok:
            where = ", ".join(f"{p.gpu_uuid}:{p.profile or (f'{p.milli}m' if p.milli else 'whole')}@{p.start}"
                              for p in self.placements)
            parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.breakdown.items(), key=lambda kv: -kv[1]))
            pre = f"; preempts {len(self.preempt)} spot" if self.preempt else ""
            return f"placed on {where} (score {self.score:.1f}: {parts}){pre}"
        total = sum(self.reasons.values())
        if not total:
            return "no GPUs in the pool"
        parts = ", ".join(f"{n} {r}" for r, n in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        return f"{total} GPUs: {parts}"
