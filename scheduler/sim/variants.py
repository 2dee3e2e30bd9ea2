"""Seeded variants of the openb traces and of the pool, so a policy can be judged on workloads it was not tuned on.

Pod-list variants (`--variant share=0.6,spec=0.2,multi=0.3,seed=7`) are built the way the public family
beside the default trace was (`gpushare40`, `gpuspec33`, `multigpu20`: the default pod list with a chosen
share of its GPU pods turned into sharing, GPU-model-pinned or multi-GPU pods). Every GPU pod keeps its
arrival, runtime and qos (the base trace's timing); only its shape is redrawn:

- share: this fraction of the GPU pods (exactly, rounded) ask for part of one GPU (`gpu_milli` < 1000),
  their milli drawn from the base trace's own sharing pods;
- multi: this fraction ask for 2, 4 or 8 whole GPUs on one node, the count drawn from the base's
  multi-GPU pods (2/4/8 as in `multigpu20` when the base has none);
- the rest ask for one whole GPU;
- spec: this fraction (chosen independently of the shape) are pinned to GPU models, the pin drawn from
  `gpuspec33`'s pins (T4 38%, G2 10%, P100 8%, ...), and every other pod is unpinned.
A share left out keeps the base's pods as they are for that property. The same variant and seed always give
the same pods.

Node-list variants (`--nodes-variant gpus=400,big=0.6,h100=0.35,l4=0.3,seed=3`) build a pool of modern
composition: `big` of the GPUs on 8-GPU nodes (A100-80GB, `h100` of them H100-80GB), the rest on
single-GPU servers (A10, `l4` of them L4), node order shuffled by the seed. Pods pinned to the trace's old
cards are mapped onto that pool by `VARIANT_MODEL_MAP` (old 16-24 GB cards to the single-GPU servers).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace
from typing import Sequence

from .pool import NodeSpec
from .trace import Pod

# gpu_spec pins of openb_pod_list_gpuspec33.csv's GPU pods (count of each), the pins a variant draws from.
GPUSPEC33_PINS: tuple[tuple[str, int], ...] = (
    ("T4", 1291), ("G2", 331), ("P100", 279), ("V100M16|V100M32", 141), ("P100|V100M16|V100M32", 103),
    ("G3", 86), ("G2|P100|T4|V100M16|V100M32", 39), ("P100|T4|V100M16|V100M32", 33),
    ("A10|G2|T4|V100M16|V100M32", 24), ("V100M32", 20), ("A10|T4", 6), ("P100|V100M16", 4),
    ("T4|V100M16|V100M32", 3), ("V100M16", 3),
)
FALLBACK_MULTI = (2, 4, 8)

# Trace model names -> catalog keys on a node-list variant (which has no A30s): the old small cards become
# the single-GPU servers, the training nodes the 8-GPU ones.
VARIANT_MODEL_MAP: dict[str, str] = {
    "P100": "l4", "T4": "l4", "V100M16": "a10", "A10": "a10", "V100M32": "a100-80gb",
    "G1": "h100-80gb", "G2": "a100-80gb", "G3": "h100-80gb",
}


def _parse(text: str, cls: type, *, ints: tuple[str, ...]) -> dict:
    names = {f.name for f in fields(cls)}
    out: dict = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in names:
            raise ValueError(f"{part!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(names))}")
        try:
            out[key] = int(value) if key in ints else float(value)
        except ValueError:
            raise ValueError(f"{part!r}: {value.strip()!r} is not a number") from None
    return out


@dataclass(frozen=True)
class PodVariant:
    """Shares of the GPU pods (None = as in the base trace) and the seed that draws them."""

    share: float | None = None  # sharing pods: one GPU, gpu_milli < 1000
    spec: float | None = None  # pods pinned to GPU models
    multi: float | None = None  # pods asking for several whole GPUs on one node
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("share", "spec", "multi"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ValueError(f"variant {name}={v}: a share is between 0 and 1")
        if (self.share or 0.0) + (self.multi or 0.0) > 1.0 + 1e-9:
            raise ValueError(f"variant share={self.share} + multi={self.multi} is more than all the GPU pods")

    @classmethod
    def parse(cls, text: str) -> "PodVariant":
        return cls(**_parse(text, cls, ints=("seed",)))

    @property
    def label(self) -> str:
        parts = [f"{n}={getattr(self, n):g}" for n in ("share", "spec", "multi") if getattr(self, n) is not None]
        return ",".join(parts + [f"seed={self.seed}"])


@dataclass(frozen=True)
class NodeVariant:
    """A pool of modern composition: 8-GPU A100/H100 nodes beside single-GPU A10/L4 servers."""

    gpus: int = 400
    big: float = 0.6  # share of the GPUs on 8-GPU nodes
    h100: float = 0.35  # share of the 8-GPU nodes that are H100-80GB (the rest A100-80GB)
    l4: float = 0.3  # share of the single-GPU servers that are L4 (the rest A10)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError("nodes variant gpus must be at least 1")
        for name in ("big", "h100", "l4"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"nodes variant {name}={getattr(self, name)}: a share is between 0 and 1")

    @classmethod
    def parse(cls, text: str) -> "NodeVariant":
        return cls(**_parse(text, cls, ints=("gpus", "seed")))

    @property
    def label(self) -> str:
        return f"gpus={self.gpus},big={self.big:g},h100={self.h100:g},l4={self.l4:g},seed={self.seed}"


def measured_shares(pods: Sequence[Pod]) -> dict[str, float]:
    """(share, spec, multi) of a pod list, as PodVariant defines them (fractions of its GPU pods)."""
    n = len(pods) or 1
    return {"share": sum(1 for p in pods if p.num_gpu == 1 and p.gpu_milli < 1000) / n,
            "spec": sum(1 for p in pods if p.gpu_spec) / n,
            "multi": sum(1 for p in pods if p.num_gpu > 1) / n}


def _pick(rng: random.Random, n: int, share: float) -> set[int]:
    return set(rng.sample(range(n), round(share * n)))


def resample_pods(pods: Sequence[Pod], variant: PodVariant) -> list[Pod]:
    """`pods` with their shapes redrawn to the variant's shares (timing and qos kept, order kept)."""
    rng = random.Random(variant.seed)
    n = len(pods)
    out = list(pods)
    if variant.share is not None or variant.multi is not None:
        base = measured_shares(pods)
        share = base["share"] if variant.share is None else variant.share
        multi = base["multi"] if variant.multi is None else variant.multi
        if share + multi > 1.0:  # one given, the other kept from the base: the given one wins
            if variant.share is None:
                share = 1.0 - multi
            else:
                multi = 1.0 - share
        millis = [p.gpu_milli for p in pods if p.num_gpu == 1 and p.gpu_milli < 1000] or [500]
        counts = [p.num_gpu for p in pods if p.num_gpu > 1] or list(FALLBACK_MULTI)
        order = list(range(n))
        rng.shuffle(order)
        n_share, n_multi = round(share * n), round(multi * n)
        for rank, i in enumerate(order):
            if rank < n_share:
                num_gpu, milli = 1, rng.choice(millis)
            elif rank < n_share + n_multi:
                num_gpu, milli = rng.choice(counts), 1000
            else:
                num_gpu, milli = 1, 1000
            out[i] = replace(out[i], num_gpu=num_gpu, gpu_milli=milli)
    if variant.spec is not None:
        pins = [tuple(s.split("|")) for s, _ in GPUSPEC33_PINS]
        weights = [w for _, w in GPUSPEC33_PINS]
        pinned = _pick(rng, n, variant.spec)
        for i in range(n):
            spec = tuple(rng.choices(pins, weights)[0]) if i in pinned else ()
            out[i] = replace(out[i], gpu_spec=spec)
    return out


def variant_nodes(v: NodeVariant) -> list[NodeSpec]:
    """The node list of a pool variant (big nodes' GPU count rounded to whole 8-GPU nodes)."""
    big_nodes = round(v.gpus * v.big / 8)
    small = max(0, v.gpus - 8 * big_nodes)
    h100_nodes = round(big_nodes * v.h100)
    l4_servers = round(small * v.l4)
    specs = ([NodeSpec(f"h100-{i:04d}", "h100-80gb", 8, "H100-80GB") for i in range(h100_nodes)]
             + [NodeSpec(f"a100-{i:04d}", "a100-80gb", 8, "A100-80GB") for i in range(big_nodes - h100_nodes)]
             + [NodeSpec(f"l4-{i:04d}", "l4", 1, "L4") for i in range(l4_servers)]
             + [NodeSpec(f"a10-{i:04d}", "a10", 1, "A10") for i in range(small - l4_servers)])
    random.Random(v.seed).shuffle(specs)
    return specs
