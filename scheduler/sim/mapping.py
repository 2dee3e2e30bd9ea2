"""How the openb trace's GPU names and pod shapes become this market's catalog models and requests.

Model mapping: every trace name is mapped explicitly (`DEFAULT_MODEL_MAP`), and `TRACE_CARDS` says what card
each name is. Where the catalog holds the card itself and it is what the market sells as it is, the name maps
to it (A10 -> `a10`, rented whole: not an A30, which can be split). The old cards the market no longer
sells become a stand-in, "the smallest MIG-capable catalog model with at least the old card's memory", so a
pod that fit the old card fits the new one and the pool keeps the trace's split between small and large:

    P100, T4, V100M16 (16 GB)          -> a30-24gb   (stand-in: 4 memory slices, 4 compute)
    V100M32 (32 GB)                    -> a100-40gb  (stand-in)
    A10 (24 GB, no MIG)                -> a10        (the card itself, rented whole)
    G2 (undisclosed, 8-GPU nodes)      -> a100-80gb
    G1, G3 (undisclosed, 8-GPU nodes)  -> h100-80gb

`mapping_notes` says, for every mapping in use that changes a card's nature (a whole-GPU card replayed as a
MIG-capable one, or the reverse), what was done and how to replay the card itself; reports print them.
Override any entry with a JSON object `{"T4": "t4", ...}`, a JSON file, or `T4=t4,G2=h100-80gb`.

Fractional pods: `gpu_milli` is a share of one GPU. By default ("memory") a share becomes a memory need of
share x a reference memory, and the engine gives the smallest MIG profile with that much memory: memory is
the hard limit in MIG (an instance that is too small runs out of memory; one with too few compute slices
only runs slower). The reference is the card the share is of: for a pod pinned to trace models
(`gpu_spec`), the smallest of those cards' memory (a 470-milli T4 pod asked for 47% of 16 GB, 7.5 GB); for
an unpinned pod, whose card the trace does not say, `reference_gb` (80 GB, the A100-80GB that G2, 71% of the
GPUs, maps to). "compute" instead asks for ceil(share x 7) compute slices. Multi-GPU pods and 1000-milli
pods take whole GPUs.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from nodeagent.hardware import gpus as gpu_catalog
from nodeagent.hardware import mig

from .errors import SimInputError


@dataclass(frozen=True)
class TraceCard:
    """What a trace GPU name is: its memory (None: undisclosed) and the catalog model that is that very card."""

    memory_gb: float | None
    catalog_key: str | None  # the card itself in the catalog; None where the catalog has no such card


# The openb node list's names (Alibaba's GPU-sharing cluster, FGD paper artifact). V100M16 is a 16 GB V100;
# the catalog's `v100` is the 32 GB board, so the 16 GB one has no catalog twin.
TRACE_CARDS: dict[str, TraceCard] = {
    "P100": TraceCard(16, "p100"),
    "T4": TraceCard(16, "t4"),
    "V100M16": TraceCard(16, None),
    "V100M32": TraceCard(32, "v100"),
    "A10": TraceCard(24, "a10"),
    "G1": TraceCard(None, None),
    "G2": TraceCard(None, None),
    "G3": TraceCard(None, None),
}

DEFAULT_MODEL_MAP: dict[str, str] = {
    "P100": "a30-24gb",  # stand-in (no MIG on a P100)
    "T4": "a30-24gb",  # stand-in (no MIG on a T4)
    "V100M16": "a30-24gb",  # stand-in
    "V100M32": "a100-40gb",  # stand-in
    "A10": "a10",  # the card itself: sold whole, never split
    "G1": "h100-80gb",
    "G2": "a100-80gb",
    "G3": "h100-80gb",
}

# The synthetic modern pool of DESIGN.md section 9 (a 2026 Alibaba spot-GPU trace): (nodes, GPUs each,
# catalog model). A800 is an export A100-80GB (same figures and MIG geometry, not a catalog model of its own);
# H800 is in the catalog.
MODERN_POOL: tuple[tuple[str, int, int, str], ...] = (
    ("A100-80GB", 432, 8, "a100-80gb"),
    ("A800-80GB", 22, 8, "a100-80gb"),
    ("H800", 219, 8, "h800-80gb"),
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


def _catalog_key(value: object) -> str:
    key = str(value).strip().lower()
    if key not in gpu_catalog.GPU_MODELS:
        raise SimInputError(f"--model-map names {value!r}, which is not a catalog model; known: "
                            f"{', '.join(gpu_catalog.GPU_MODELS)}", field="model_map")
    return key


def parse_model_map(spec: str | None) -> dict[str, str]:
    """The default mapping updated by `spec`: a JSON file path, a JSON object, or "T4=a30-24gb,G2=h100-80gb"."""
    mapping = dict(DEFAULT_MODEL_MAP)
    if not spec:
        return mapping
    text = spec.strip()
    try:
        if text.startswith(("{", "[")):
            override = json.loads(text)
        elif Path(text).is_file():
            override = json.loads(Path(text).read_text())
        else:
            override = {}
            for part in text.split(","):
                old, sep, new = part.partition("=")
                if not sep or not old.strip() or not new.strip():
                    raise SimInputError(f"--model-map entry {part!r} is not TRACE-NAME=catalog-key",
                                        field="model_map")
                override[old.strip()] = new.strip()
    except json.JSONDecodeError as e:
        raise SimInputError(f"--model-map is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                            field="model_map") from None
    if not isinstance(override, dict):
        raise SimInputError("--model-map must be a JSON object of trace model -> catalog key", field="model_map")
    for old, new in override.items():
        mapping[str(old)] = _catalog_key(new)  # refuse unknown catalog keys now, not mid-replay
    return mapping


def map_model(old: str, mapping: dict[str, str]) -> str:
    try:
        return mapping[old]
    except KeyError:
        raise SimInputError(f"the node list names GPU model {old!r}, which has no mapping to a catalog model: "
                            f"add one with --model-map '{old}=<catalog key>' (known keys: "
                            f"{', '.join(gpu_catalog.GPU_MODELS)})", field="model_map") from None


def mapping_notes(names: set[str] | list[str], mapping: dict[str, str]) -> list[str]:
    """One line per trace name in use whose mapping changes the card's nature (MIG-capable or rented whole)."""
    notes = []
    for old in sorted(set(names)):
        card, new = TRACE_CARDS.get(old), mapping.get(old)
        if card is None or card.catalog_key is None or new is None or new == card.catalog_key:
            continue
        was = gpu_catalog.model_for(card.catalog_key)
        now = gpu_catalog.model_for(new)
        if was.mig_capable == now.mig_capable:
            continue
        what = "MIG-capable, split into slices" if now.mig_capable else "not MIG-capable, rented whole"
        notes.append(f"{old} ({was.name}, {'MIG-capable' if was.mig_capable else 'no MIG'}) is replayed as "
                     f"{now.name} ({what}); --model-map {old}={card.catalog_key} replays the card itself")
    return notes


def map_spec(spec: tuple[str, ...], mapping: dict[str, str]) -> frozenset[str] | None:
    """Allowed catalog models for a pod's gpu_spec (None = any). Unknown old names are ignored, as the trace's
    scheduler would ignore a model it has no nodes of; a spec naming only unknown models allows nothing."""
    if not spec:
        return None
    return frozenset(mapping[s] for s in spec if s in mapping)


def reference_gb_for(spec: tuple[str, ...], default_gb: float) -> float:
    """The memory a pinned pod's share is of: the smallest of its pinned cards (where the trace discloses
    them), so the pod fits every card it may run on as it did in the trace; otherwise `default_gb`."""
    known = [TRACE_CARDS[s].memory_gb for s in spec if s in TRACE_CARDS and TRACE_CARDS[s].memory_gb]
    return min(known) if known else default_gb


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
        raise SimInputError(f"fraction basis must be one of {FRACTION_BASES}, not {basis!r}")
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
        ref = reference_gb_for(gpu_spec, reference_gb)
        return Demand(False, 1, memory_need_gb(gpu_milli, reference_gb=ref), 1, models, priority_for(qos), share)
    if basis == "compute":
        return Demand(False, 1, 0.0, compute_need(gpu_milli), models, priority_for(qos), share)
    raise SimInputError(f"fraction basis must be one of {FRACTION_BASES}, not {basis!r}")
