"""Performance units (PU): one normalised measure of what a slice delivers, so prices compare across models.

Defined once here; `docs/performance-units.md` explains the choice. An A100-80GB whole GPU is 10 PU.

    PU = 10 × ( 0.60 × tensor_share × T / 312
              + 0.25 × memory_share × B / 2039
              + 0.15 × memory_gb / 80 )

T = dense BF16 tensor TFLOPS (FP16 tensor where the GPU has no BF16), B = memory bandwidth in GB/s, and for
a MIG profile tensor_share = compute slices / the GPU's compute slices, memory_share = memory slices / the
GPU's memory slices, memory_gb = the profile's memory. 312 TFLOPS, 2039 GB/s and 80 GB are the A100-80GB's
figures, the reference. The weights follow what dominates ML work: matrix throughput first, then the
bandwidth that feeds it, then how large a model fits.
"""
from __future__ import annotations

from nodeagent.hardware.gpus import GpuModelSpec
from nodeagent.hardware.mig import MigProfile

REFERENCE_TENSOR_TFLOPS = 312.0
REFERENCE_BANDWIDTH_GBS = 2039.0
REFERENCE_MEMORY_GB = 80.0
REFERENCE_PU = 10.0
W_TENSOR, W_BANDWIDTH, W_MEMORY = 0.60, 0.25, 0.15


def _pu(tensor_tflops: float, bandwidth_gbs: float, memory_gb: float) -> float:
    return round(REFERENCE_PU * (
        W_TENSOR * tensor_tflops / REFERENCE_TENSOR_TFLOPS
        + W_BANDWIDTH * bandwidth_gbs / REFERENCE_BANDWIDTH_GBS
        + W_MEMORY * memory_gb / REFERENCE_MEMORY_GB), 3)


def gpu_pu(spec: GpuModelSpec) -> float:
    """Performance units of a whole GPU of this model."""
    return _pu(spec.tensor_tflops, spec.memory_bandwidth_gbs, spec.memory_gb)


def profile_pu(spec: GpuModelSpec, profile: MigProfile) -> float:
    """Performance units of one MIG instance of `profile` on this model."""
    if spec.mig is None:
        raise ValueError(f"{spec.name} has no MIG profiles")
    g = spec.mig
    return _pu(spec.tensor_tflops * profile.compute_slices / g.compute_slices,
               spec.memory_bandwidth_gbs * profile.memory_slices / g.memory_slices,
               profile.memory_gb)
