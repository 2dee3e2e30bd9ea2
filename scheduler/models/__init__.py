from .catalog import GpuModel, GpuProfile
from .fleet import AgentCommand, Gpu, HealthEvent, Node, OutboxEvent, Slice
from .metrics import GpuMetricLatest, GpuMetricRollup

__all__ = ["GpuModel", "GpuProfile", "Node", "Gpu", "Slice", "AgentCommand", "HealthEvent", "OutboxEvent", "GpuMetricRollup", "GpuMetricLatest"]
