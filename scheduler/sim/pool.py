"""Building the simulated pool: the openb node list through the model mapping, or the modern pool of DESIGN §9.

GPUs are what the engine places. A node's host CPU and memory (the node list's `cpu_milli`, `memory_mib`)
are carried on `NodeSpec` and, when the replay models them (`--host model`), booked in a `HostLedger`: a pod
then also needs its CPU and memory on the node its GPUs are on, and CPU-only pods take their share of the
hosts. Without it (`--host ignore`, the default) host resources are left out, as the market sells GPUs and
slices, not host cores. All nodes sit in one region, and every GPU is priced at the same price per performance unit
(`PRICE_PER_PU_HOUR` x its PU, scheduler.core.perf), so the engine's price and latency scores cannot tell
nodes apart and the comparison between policies is about packing alone. (One price per GPU for every model
would not be neutral: an A100 at an A30's price is a bargain the price scorer would rightly chase.)

`scale` keeps a share of the nodes of each model (evenly spread through the list, at least one node of a
model that has any), so a scaled pool keeps the trace's mix of cards; the openb trace at its own size asks
for 0.2% of its 6,212 GPUs on average, too little to make any policy work for its living.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from nodeagent.hardware import gpus as gpu_catalog
from scheduler.core import perf
from scheduler.core.model import GpuState, NodeState

from .errors import SimInputError
from .mapping import MODERN_POOL, map_model
from .trace import TraceNode

SIM_REGION = "ap-southeast"  # the trace comes from an Alibaba cluster; one region for all, see above
PRICE_PER_PU_HOUR = 0.2  # an A100-80GB (10 PU) at 2.0 per GPU-hour


@dataclass(frozen=True)
class NodeSpec:
    id: str
    model: str  # catalog key
    gpus: int
    source_model: str  # the trace's (or the modern list's) model name
    cpu_milli: int = 0  # host CPU; 0 = not known (the modern pool)
    memory_mib: int = 0


def _spread(items: list, keep: int) -> list:
    """`keep` items evenly spread through `items` (deterministic, keeps the list's order)."""
    if keep >= len(items):
        return list(items)
    step = len(items) / keep
    return [items[int(i * step)] for i in range(keep)]


def _scaled(groups: "OrderedDict[str, list]", scale: float) -> list:
    if scale <= 0:
        raise SimInputError("--pool-scale must be > 0")
    out: list = []
    for members in groups.values():
        out.extend(_spread(members, max(1, round(len(members) * scale))))
    return out


def openb_pool(nodes: list[TraceNode], mapping: dict[str, str], *, scale: float = 1.0) -> list[NodeSpec]:
    groups: OrderedDict[str, list[NodeSpec]] = OrderedDict()
    for n in nodes:
        spec = NodeSpec(n.name, map_model(n.model, mapping), n.gpus, n.model, n.cpu_milli, n.memory_mib)
        groups.setdefault(n.model, []).append(spec)
    return sorted(_scaled(groups, scale), key=lambda s: s.id)


def modern_pool(*, scale: float = 1.0) -> list[NodeSpec]:
    groups: OrderedDict[str, list[NodeSpec]] = OrderedDict()
    for label, count, per_node, key in MODERN_POOL:
        groups[label] = [NodeSpec(f"{label.lower()}-{i:04d}", key, per_node, label) for i in range(count)]
    return _scaled(groups, scale)


def node_states(specs: list[NodeSpec]) -> list[NodeState]:
    """Fresh, empty engine nodes for one run (every policy gets its own copy)."""
    out: list[NodeState] = []
    for s in specs:
        model = gpu_catalog.model_for(s.model)
        gpus = [GpuState(uuid=f"{s.id}/gpu{i}", node_id=s.id, model=model.key, geometry=model.mig)
                for i in range(s.gpus)]
        price = round(PRICE_PER_PU_HOUR * perf.gpu_pu(model), 4)
        out.append(NodeState(id=s.id, region=SIM_REGION, price_per_gpu_hour=price, gpus=gpus))
    return out


class HostLedger:
    """Free host CPU (milli) and memory (MiB) per node, for a replay that models them."""

    def __init__(self, specs: list[NodeSpec]) -> None:
        missing = [s.id for s in specs if s.cpu_milli <= 0 or s.memory_mib <= 0]
        if missing:
            raise SimInputError(f"host CPU and memory can only be modelled on a node list that gives them: "
                                f"{len(missing)} nodes ({', '.join(missing[:3])}...) have no cpu_milli or "
                                f"memory_mib; replay with --host ignore")
        self.capacity = {s.id: (s.cpu_milli, s.memory_mib) for s in specs}
        self.cpu = {s.id: s.cpu_milli for s in specs}  # free now
        self.memory = {s.id: s.memory_mib for s in specs}
        self.order = sorted(self.cpu)

    def fits(self, node_id: str, cpu_milli: int, memory_mib: int) -> bool:
        return self.cpu[node_id] >= cpu_milli and self.memory[node_id] >= memory_mib

    def could_hold(self, node_id: str, cpu_milli: int, memory_mib: int) -> bool:
        """Whether the node, empty, holds this much."""
        cpu, memory = self.capacity[node_id]
        return cpu >= cpu_milli and memory >= memory_mib

    def ever_fits(self, cpu_milli: int, memory_mib: int) -> bool:
        """Whether some node, empty, could hold this much (one node holding both, not the largest of each)."""
        return any(self.could_hold(n, cpu_milli, memory_mib) for n in self.order)

    def take(self, node_id: str, cpu_milli: int, memory_mib: int) -> None:
        self.cpu[node_id] -= cpu_milli
        self.memory[node_id] -= memory_mib

    def give(self, node_id: str, cpu_milli: int, memory_mib: int) -> None:
        self.cpu[node_id] += cpu_milli
        self.memory[node_id] += memory_mib

    def roomiest(self, cpu_milli: int, memory_mib: int, *, skip: str | None = None) -> str | None:
        """Where a CPU-only pod goes: the node with the most free CPU that holds it (node id on ties). The
        same rule for every policy, so the comparison stays about GPU placement; spreading CPU-only pods
        is what Kubernetes' default LeastAllocated scoring does. `skip`: a node kept for a starving GPU pod."""
        best, best_cpu = None, -1
        for n in self.order:
            if self.cpu[n] > best_cpu and n != skip and self.fits(n, cpu_milli, memory_mib):
                best, best_cpu = n, self.cpu[n]
        return best


def pool_summary(specs: list[NodeSpec]) -> dict:
    """Nodes and GPUs per (source model -> catalog model), for reports."""
    rows: dict[str, dict] = {}
    for s in specs:
        key = f"{s.source_model} -> {s.model}"
        row = rows.setdefault(key, {"nodes": 0, "gpus": 0})
        row["nodes"] += 1
        row["gpus"] += s.gpus
    return {"nodes": len(specs), "gpus": sum(s.gpus for s in specs), "by_model": rows}
