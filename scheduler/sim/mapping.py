"""How the openb trace's old GPUs and pod shapes become this market's MIG-capable models and requests.

Model mapping (default; override any entry with a JSON object `{"T4": "a100-40gb", ...}` or `T4=a100-40gb`):
the rule is "the smallest MIG-capable catalog model with at least the old GPU's memory", so a pod that fit
the old card fits the new one, and the pool keeps the trace's split between small and large cards.

    P100 (16 GB), T4 (16 GB), V100M16 (16 GB), A10 (24 GB)  -> a30-24gb   (4 memory slices, 4 compute)
    V100M32 (32 GB)                                          -> a100-40gb
    G2 (8-GPU training nodes, 71% of the trace's GPUs)       -> a100-80gb
    G1, G3 (undisclosed, 8-GPU nodes, the newest class)      -> h100-80gb

Fractional pods: `gpu_milli` is a share of one GPU. By default ("memory") a share becomes a memory need of
share x the reference GPU's memory (80 GB: the A100-80GB that G2 maps to), and the engine gives the
smallest MIG profile with that much memory: memory is the hard limit in MIG (an instance that is too small
runs out of memory; one with too few compute slices only runs slower). "compute" instead asks for
ceil(share x 7) compute slices. Multi-GPU pods and 1000-milli pods take whole GPUs.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from nodeagent.hardware import gpus as gpu_catalog
from nodeagent.hardware import mig

DEFAULT_MODEL_MAP: dict[str, str] = {
    "P100": "a30-24gb",
    "T4": "a30-24gb",
    "V100M16": "a30-24gb",
    "A10": "a30-24gb",
    "V100M32": "a100-40gb",
    "G1": "h100-80gb",
    "G2": "a100-80gb",
    "G3": "h100-80gb",
}

# The synthetic modern pool of DESIGN.md section 9 (a 2026 Alibaba spot-GPU trace): (nodes, GPUs each,
# catalog model). A800 is an export A100-80GB and H800 an export H100 with the same MIG geometry.
MODERN_POOL: tuple[tuple[str, int, int, str], ...] = (
    ("A100-80GB", 432, 8, "a100-80gb"),
    ("A800-80GB", 22, 8, "a100-80gb"),
    ("H800", 219, 8, "h100-80gb"),
    ("A10", 2494, 1, "a10"),  # no MIG: rented whole
)

# qos classes of the trace -> priority (higher runs first). Guaranteed and LS (latency-sensitive) pods are
# the ones the Alibaba cluster protects; Burstable sits between; BE (best effort) is last.
QOS_PRIORITY: dict[str, int] = {"Guaranteed": 3, "LS": 2, "Burstable": 1, "BE": 0}
DEFAULT_PRIORITY = QOS_PRIORITY["LS"]

REFERENCE_MODEL = "a100-80gb"
FRACTION_BASES = ("memory", "compute")


def priority_for(qos: str) -> int:
    """Priority class of a qos value; unknown values are treated as LS (the trace's most common class)."""
    return QOS_PRIORITY.get(qos, DEFAULT_PRIORITY)


def parse_model_map(spec: str | None) -> dict[str, str]:
    """The default mapping updated by `spec`: a JSON file path, a JSON object, or "T4=a30-24gb,G2=h100-80gb"."""
    mapping = dict(DEFAULT_MODEL_MAP)
    if not spec:
        return mapping
    text = spec.strip()
    if text.startswith("{"):
        override = json.loads(text)
    elif Path(text).is_file():
        override = json.loads(Path(text).read_text())
    else:
        override = {}
        for part in text.split(","):
            old, sep, new = part.partition("=")
            if not sep or not old.strip() or not new.strip():
                raise ValueError(f"model mapping entry {part!r} is not OLD=catalog-key")
            override[old.strip()] = new.strip()
    if not isinstance(override, dict):
        raise ValueError("model mapping must be a JSON object of trace model -> catalog key")
    for old, new in override.items():
        gpu_catalog.model_for(str(new))  # refuse unknown catalog keys now, not mid-replay
        mapping[str(old)] = str(new).lower()
    return mapping


def map_model(old: str, mapping: dict[str, str]) -> str:
    try:
        return mapping[old]
    except KeyError:
        raise KeyError(f"trace GPU model {old!r} has no mapping; add it with --model-map {old}=<catalog key>")


def map_spec(spec: tuple[str, ...], mapping: dict[str, str]) -> frozenset[str] | None:
    """Allowed catalog models for a pod's gpu_spec (None = any). Unknown old names are ignored, as the trace's
    scheduler would ignore a model it has no nodes of; a spec naming only unknown models allows nothing."""
    if not spec:
        return None
    return frozenset(mapping[s] for s in spec if s in mapping)


def memory_need_gb(gpu_milli: int, *, reference_gb: float) -> float:
    return round(gpu_milli / 1000 * reference_gb, 3)


def compute_need(gpu_milli: int, *, compute_slices: int = 7) -> int:
    return max(1, math.ceil(gpu_milli / 1000 * compute_slices - 1e-9))


def profile_for_share(gpu_milli: int, model_key: str, *, basis: str = "memory",
                      reference_gb: float | None = None) -> str | None:
    """The MIG profile a fractional pod gets on `model_key` (None: no profile fits, or the GPU has no MIG).

    With basis "memory" the need is share x `reference_gb` (default: this model's own memory, the table
    shown in docs/simulator.md); with "compute" it is ceil(share x the model's compute slices).
    """
    spec = gpu_catalog.model_for(model_key)
    if spec.mig is None:
        return None
    if gpu_milli >= 1000:
        return spec.mig.full_profile.name
    if basis == "memory":
        ref = spec.memory_gb if reference_gb is None else reference_gb
        p = mig.smallest_fitting_profile(spec.mig, memory_gb=memory_need_gb(gpu_milli, reference_gb=ref))
    elif basis == "compute":
        p = mig.smallest_fitting_profile(spec.mig, memory_gb=0,
                                         compute_slices=compute_need(gpu_milli,
                                                                     compute_slices=spec.mig.compute_slices))
    else:
        raise ValueError(f"fraction basis must be one of {FRACTION_BASES}, not {basis!r}")
    return p.name if p else None


@dataclass(frozen=True)
class Demand:
    """What one pod asks the market for, in the market's terms (engine-independent)."""

    whole_gpu: bool
    gpu_count: int
    memory_gb: float  # per GPU; 0 for whole GPUs (any model's whole GPU will do)
    compute_slices: int  # per GPU, for MIG requests
    models: frozenset[str] | None  # allowed catalog keys; None = any
    priority: int
    share: float  # GPUs the trace pod asked for (num_gpu x gpu_milli / 1000): the "useful" allocation

    @property
    def key(self) -> tuple:
        """Identity of the request shape: two queued pods with the same key fit or fail together."""
        return (self.whole_gpu, self.gpu_count, self.memory_gb, self.compute_slices, self.models)


def demand_for(num_gpu: int, gpu_milli: int, gpu_spec: tuple[str, ...], qos: str, *,
               mapping: dict[str, str], basis: str = "memory", reference_gb: float = 80.0) -> Demand:
    models = map_spec(gpu_spec, mapping)
    whole = num_gpu > 1 or gpu_milli >= 1000
    share = num_gpu * gpu_milli / 1000
    if whole:
        return Demand(True, num_gpu, 0.0, 0, models, priority_for(qos), share)
    if basis == "memory":
        return Demand(False, 1, memory_need_gb(gpu_milli, reference_gb=reference_gb), 1, models,
                      priority_for(qos), share)
    if basis == "compute":
        return Demand(False, 1, 0.0, compute_need(gpu_milli), models, priority_for(qos), share)
    raise ValueError(f"fraction basis must be one of {FRACTION_BASES}, not {basis!r}")
