"""Small pool builders for the scheduler core tests (plain data, no database)."""
from __future__ import annotations

from nodeagent.hardware.gpus import GPU_MODELS
from scheduler.core.model import GpuState, NodeState, PlacedInstance


def gpu(uuid: str, model: str = "a100-80gb", *, instances=(), health="healthy", mig_on: bool = True,
        node_id: str = "") -> GpuState:
    """`instances`: (profile, start) or (profile, start, lease, class, value) tuples."""
    placed = []
    for t in instances:
        profile, start, *rest = t
        lease = rest[0] if rest else f"{uuid}-{profile}-{start}"
        cls = rest[1] if len(rest) > 1 else "on_demand"
        value = rest[2] if len(rest) > 2 else 1.0
        placed.append(PlacedInstance(profile, start, lease, cls, value))
    geometry = GPU_MODELS[model].mig if mig_on else None
    return GpuState(uuid=uuid, node_id=node_id, model=model, geometry=geometry, instances=placed, health=health)


def node(node_id: str, *gpus: GpuState, region: str = "us-east", price: float = 2.0, online: bool = True,
         cuda: str = "12.4", reliability: float = 0.99, interruption_rate: float = 0.0) -> NodeState:
    for g in gpus:
        g.node_id = node_id
    return NodeState(id=node_id, region=region, online=online, cuda_version=cuda, price_per_gpu_hour=price,
                     reliability=reliability, interruption_rate=interruption_rate, gpus=list(gpus))


def uniform_nodes(count: int, per_node: int = 2, model: str = "a100-80gb", **kw) -> list[NodeState]:
    return [node(f"n{i}", *[gpu(f"n{i}-g{j}", model) for j in range(per_node)], **kw) for i in range(count)]
