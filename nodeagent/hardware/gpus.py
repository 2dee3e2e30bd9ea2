"""The GPU catalog as plain data: one entry per model, with its MIG geometry where it has one.

The data migration of `scheduler` seeds the GpuModel table from this list, the simulated agent builds its
fake GPUs from it, and the simulator builds pools from it. Figures are NVIDIA's published datasheet values
(dense tensor throughput, no sparsity; SXM variants where both exist).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import mig


@dataclass(frozen=True)
class GpuModelSpec:
    key: str  # stable slug used on the command line and in the API: "h100-80gb"
    name: str
    memory_gb: float
    fp64_tflops: float
    fp32_tflops: float
    bf16_tensor_tflops: float  # dense; 0 where the GPU has no BF16 tensor cores (Volta, Turing)
    fp16_tensor_tflops: float  # dense; what PU falls back to without BF16
    memory_bandwidth_gbs: float
    compute_capability: str  # "9.0"
    tdp_w: int
    mig: mig.MigGeometry | None = None

    @property
    def mig_capable(self) -> bool:
        return self.mig is not None

    @property
    def tensor_tflops(self) -> float:
        return self.bf16_tensor_tflops or self.fp16_tensor_tflops


GPU_MODELS: dict[str, GpuModelSpec] = {
    s.key: s
    for s in (
        GpuModelSpec("a100-40gb", "A100-40GB", 40, 9.7, 19.5, 312, 312, 1555, "8.0", 400, mig.A100_40GB),
        GpuModelSpec("a100-80gb", "A100-80GB", 80, 9.7, 19.5, 312, 312, 2039, "8.0", 400, mig.A100_80GB),
        GpuModelSpec("h100-80gb", "H100-80GB", 80, 34, 67, 989, 989, 3350, "9.0", 700, mig.H100_80GB),
        GpuModelSpec("h100-nvl-94gb", "H100-NVL-94GB", 94, 30, 60, 835, 835, 3938, "9.0", 400,
                     mig.H100_NVL_94GB),
        GpuModelSpec("h200-141gb", "H200-141GB", 141, 34, 67, 989, 989, 4800, "9.0", 700, mig.H200_141GB),
        GpuModelSpec("a30-24gb", "A30-24GB", 24, 5.2, 10.3, 165, 165, 933, "8.0", 165, mig.A30_24GB),
        GpuModelSpec("l40s", "L40S", 48, 1.43, 91.6, 362, 362, 864, "8.9", 350),
        GpuModelSpec("l4", "L4", 24, 0.49, 30.3, 121, 121, 300, "8.9", 72),
        GpuModelSpec("a10", "A10", 24, 0.98, 31.2, 125, 125, 600, "8.6", 150),
        GpuModelSpec("rtx-4090", "RTX-4090", 24, 1.29, 82.6, 165, 165, 1008, "8.9", 450),
        GpuModelSpec("v100", "V100", 32, 7.8, 15.7, 0, 125, 900, "7.0", 300),
        GpuModelSpec("t4", "T4", 16, 0.25, 8.1, 0, 65, 320, "7.5", 70),
        # Added for the simulator's modern pool and the openb trace's old cards (docs/simulator.md, "Catalog
        # figures", says where each figure comes from). H800: NVIDIA H800 SXM5 datasheet (an H100 with FP64
        # and NVLink cut). H20: NVIDIA H20 datasheet (96 GB HBM3, 4.0 TB/s, 148 TFLOPS dense BF16/FP16).
        # L20: NVIDIA L20 datasheet (48 GB GDDR6, no MIG; FP64 is Ada's 1/64 of FP32, not printed there).
        # B200: NVIDIA HGX B200 datasheet divided by its 8 GPUs (180 GB, 8 TB/s, 2.25 PFLOPS dense BF16).
        # P100: NVIDIA Tesla P100 PCIe 16 GB datasheet; no tensor cores, so its "tensor" figure is the
        # packed-FP16 rate (18.7), what PU falls back to.
        GpuModelSpec("h800-80gb", "H800-80GB", 80, 1, 67, 989, 989, 3350, "9.0", 700, mig.H800_80GB),
        GpuModelSpec("h20-96gb", "H20-96GB", 96, 1, 44, 148, 148, 4000, "9.0", 400, mig.H20_96GB),
        GpuModelSpec("l20", "L20", 48, 0.93, 59.8, 119.5, 119.5, 864, "8.9", 275),
        GpuModelSpec("b200-180gb", "B200-180GB", 180, 37, 75, 2250, 2250, 8000, "10.0", 1000, mig.B200_180GB),
        GpuModelSpec("p100", "P100", 16, 4.7, 9.3, 0, 18.7, 732, "6.0", 250),
    )
}

# Names NVML reports (nvmlDeviceGetName) mapped to catalog keys; matched by substring, longest first.
NVML_NAME_HINTS: tuple[tuple[str, str], ...] = (
    ("H100 NVL", "h100-nvl-94gb"),
    ("H200", "h200-141gb"),
    ("H100", "h100-80gb"),
    ("H800", "h800-80gb"),
    ("H20", "h20-96gb"),  # after H200: "NVIDIA H200" contains "H20"
    ("B200", "b200-180gb"),
    ("L20", "l20"),
    ("P100", "p100"),
    ("A100-SXM4-40GB", "a100-40gb"),
    ("A100-PCIE-40GB", "a100-40gb"),
    ("A100 40GB", "a100-40gb"),
    ("A100", "a100-80gb"),
    ("A30", "a30-24gb"),
    ("L40S", "l40s"),
    ("L4", "l4"),
    ("A10", "a10"),
    ("4090", "rtx-4090"),
    ("V100", "v100"),
    ("T4", "t4"),
)


def model_for(key: str) -> GpuModelSpec:
    try:
        return GPU_MODELS[key.lower()]
    except KeyError:
        raise KeyError(f"unknown GPU model {key!r}; known: {', '.join(GPU_MODELS)}") from None


def name_of(key: str) -> str:
    """The model's name as people read it ("H100-80GB"), wherever a catalog key ("h100-80gb") is shown; an
    unknown key as it is."""
    spec = GPU_MODELS.get((key or "").lower())
    return spec.name if spec is not None else key


def _words(text: str) -> str:
    # NVML writes "A100-SXM4-40GB" and "H100 NVL"; the simulated agent "A100-40GB": compare them alike.
    return " ".join(text.lower().replace("-", " ").replace("_", " ").split())


def key_for_nvml_name(name: str) -> str | None:
    """Catalog key for a name as NVML reports it ("NVIDIA H100 80GB HBM3"), or None if unknown."""
    words = _words(name)
    for hint, key in NVML_NAME_HINTS:
        if _words(hint) in words:
            return key
    return None


# What NVML reports as a GPU's total memory (MiB) against the catalog's GB: 0.94 (L4, L40S, T4: ECC and
# reserved memory) to 1.0. The band keeps the catalog's neighbours apart (H100-80GB is 0.85 of an H100 NVL).
MEMORY_BAND = (0.9, 1.05)


def memory_agrees(key: str, memory_mib: float) -> bool:
    """Whether `memory_mib` is what a GPU of catalog model `key` reports."""
    low, high = MEMORY_BAND
    return low <= memory_mib / (GPU_MODELS[key].memory_gb * 1024) <= high


def key_for_gpu(name: str, memory_mib: float) -> str | None:
    """Catalog key for a GPU NVML names `name` with `memory_mib`, or None when the name is unknown or the
    memory says another board (an L40 is not an L4, a 16 GB V100 not the catalog's 32 GB one)."""
    key = key_for_nvml_name(name)
    return key if key is not None and memory_agrees(key, memory_mib) else None


def model_disagreement(key: str, *, name: str, memory_mib: float) -> str | None:
    """Why a GPU reported as catalog model `key` is not one (its name or memory is another model's), or None
    when they agree. An unknown key is not judged: a newer agent may know models this side does not."""
    spec = GPU_MODELS.get(key)
    if spec is None:
        return None
    named = key_for_nvml_name(name)
    if named != key:
        return (f"says model {key} but its name {name[:80]!r} is "
                f"{GPU_MODELS[named].name if named else 'not a ' + spec.name}")
    if not memory_agrees(key, memory_mib):
        return f"says model {key} ({spec.memory_gb:g} GB) but reports {memory_mib:g} MiB of memory"
    return None
