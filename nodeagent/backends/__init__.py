"""Backends the agent can drive: real GPUs through NVML, or a simulated machine."""
from .base import Backend

__all__ = ["Backend"]
