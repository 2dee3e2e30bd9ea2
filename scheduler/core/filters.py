"""Filter plugins: hard constraints. Each returns None (pass) or a short reason, and never raises.

Reasons are counted per GPU in `Decision.reasons`, so they are worded to read well after a count
("200 wrong model", "12 cuda 12.2 < required 12.4") and carry only request-wide numbers, not per-GPU ones,
so that counts group. A GPU is charged to the first filter that refuses it, in the order of `DEFAULT_FILTERS`.

`scope` says what a result depends on besides the request: "model" = the GPU's model and MIG mode only,
"node" = the node only, "gpu" = anything about the GPU and its node. The scheduler reuses results by scope
(once per model kind, once per node), and counts reasons in bulk where a leading run of filters allows it.

Degraded GPUs take spot requests only: spot is interruptible and cheap, so a GPU that may fail soon is still
worth selling there, while reserved and on-demand buyers are promised capacity that runs (a choice of ours;
the brief leaves it open).
"""
from __future__ import annotations

import functools
import re
from typing import Literal, Protocol

from nodeagent.hardware.gpus import GpuModelSpec
from .model import GpuState, NodeState, Request
from .pricing import slice_share

Scope = Literal["model", "node", "gpu"]


@functools.lru_cache(maxsize=1024)
def version_tuple(v: str) -> tuple[int, ...]:
    """"12.10" -> (12, 10): versions compare numerically, not as strings ("12.10" > "12.9")."""
    out = []
    for part in v.strip().lstrip("vV").split("."):
        m = re.match(r"\d+", part)  # "4-rc1" -> 4: a suffix never outranks the number
        out.append(int(m.group()) if m else 0)
    while len(out) > 1 and out[-1] == 0:
        out.pop()
    return tuple(out)


class PoolView(Protocol):
    """What filters and scorers may ask the pool (engine.Pool implements it)."""

    def spec(self, model: str) -> GpuModelSpec: ...
    def slice_for(self, gpu: GpuState, request: Request) -> tuple[str | None, str | None]: ...
    def free_share(self, model: str | None = None) -> float: ...
    def price_per_hour(self, *, base_per_gpu_hour: float, share: float, mode: str, model: str) -> float: ...
    def has_legal_start(self, gpu: GpuState, profile: str) -> bool: ...
    def is_free(self, gpu: GpuState) -> bool: ...
    def free_gpu_count(self, node: NodeState, request: Request) -> int: ...
    def milli_free(self, gpu: GpuState) -> int: ...
    def host_fits(self, node: NodeState, request: Request) -> str | None: ...


class Filter:
    """A hard constraint. `groupable`: the answer depends on the GPU only through its model, MIG mode,
    health and what can be placed on it now (so `Scheduler.reasons` may check one GPU per such group).

    For the pool's reason buckets (pool.py), a filter also says which node fields it reads (`node_fields`;
    None = unknown, which turns bucketed counting off) and whether it depends on the node's free GPUs
    (`per_node_free`: answered once per node bucket, and only for GPUs every other filter passed).
    `active(request)` False means the filter passes every GPU for that request (its fields then don't matter).
    """

    name: str = "filter"
    scope: Scope = "gpu"
    groupable: bool = True
    node_fields: tuple[str, ...] | None = None
    per_node_free: bool = False

    def active(self, request: Request) -> bool:
        return True

    def check(self, request: Request, node: NodeState, gpu: GpuState, view: PoolView) -> str | None:
        raise NotImplementedError


class NodeOnline(Filter):
    name, scope, node_fields = "node_online", "node", ("online",)

    def check(self, request, node, gpu, view):
        return None if node.online else "node offline"


class GpuHealthy(Filter):
    name, scope, node_fields = "gpu_health", "gpu", ()

    def check(self, request, node, gpu, view):
        if gpu.health == "cordoned":
            return "cordoned"
        if gpu.health == "degraded" and request.mode != "spot":
            return "degraded (spot only)"
        return None


class ModelAllowed(Filter):
    name, scope, node_fields = "model", "model", ()

    def check(self, request, node, gpu, view):
        if request.models is not None and gpu.model not in request.models:
            return "wrong model"
        return None


class CudaVersion(Filter):
    name, scope, node_fields = "cuda", "node", ("cuda_version",)

    def active(self, request):
        return bool(request.min_cuda)

    def check(self, request, node, gpu, view):
        if request.min_cuda and version_tuple(node.cuda_version) < version_tuple(request.min_cuda):
            return f"cuda {node.cuda_version} < required {request.min_cuda}"
        return None


class ComputeCapability(Filter):
    name, scope, node_fields = "compute_capability", "model", ()

    def check(self, request, node, gpu, view):
        if request.min_compute_capability:
            cc = view.spec(gpu.model).compute_capability
            if version_tuple(cc) < version_tuple(request.min_compute_capability):
                return f"compute capability {cc} < required {request.min_compute_capability}"
        return None


class RegionAllowed(Filter):
    name, scope, node_fields = "region", "node", ("region",)

    def active(self, request):
        return request.regions is not None

    def check(self, request, node, gpu, view):
        if request.regions is not None and node.region not in request.regions:
            return "region not allowed"
        return None


class RunsImage(Filter):
    """An order with a workload needs a node whose agent runs containers and whose provider allows its image."""

    name, scope, node_fields = "image", "node", ("runs_containers", "image_allowlist")

    def active(self, request):
        return request.image is not None

    def check(self, request, node, gpu, view):
        if request.image is None:
            return None
        if not node.runs_containers:
            return "node runs no containers"
        if not image_allowed(request.image, node.image_allowlist):
            return "image not allowed by the provider"
        return None


def canonical_image(ref: str) -> str:
    """An image reference written out in full, as an allow-list compares it: `ubuntu:24.04` is
    `docker.io/library/ubuntu:24.04`, `me/app` is `docker.io/me/app`; a first part with a dot or a port, or
    `localhost`, is a registry and stays."""
    first, sep, _ = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return ref
    return f"docker.io/{ref}" if sep else f"docker.io/library/{ref}"


def image_allowed(image: str, allowlist) -> bool:
    """Whether a provider's allow-list (reference prefixes, each written out in full; empty: all) lets `image`
    run: `docker.io/library/` allows Docker's official images, `ghcr.io/acme/` one organisation's, a whole
    reference one image."""
    if not allowlist:
        return True
    full = canonical_image(image)
    return any(full.startswith(canonical_image(p)) for p in allowlist)


class MemoryPerSlice(Filter):
    """The GPU (or one of its MIG profiles) offers the memory and compute slices asked for."""

    name, scope, node_fields = "memory", "model", ()

    def check(self, request, node, gpu, view):
        _, reason = view.slice_for(gpu, request)
        return reason


class PriceCap(Filter):
    """Slice price in the request's class (× gpu_count) at or under the cap; for spot the cap is the bid."""

    name, scope, node_fields = "price", "gpu", ("price_per_gpu_hour",)

    def active(self, request):
        return request.max_price_per_hour is not None

    def check(self, request, node, gpu, view):
        if request.max_price_per_hour is None:
            return None
        profile, _ = view.slice_for(gpu, request)
        share = slice_share(geometry=gpu.geometry, profile=profile)
        price = max(1, request.gpu_count) * view.price_per_hour(
            base_per_gpu_hour=node.price_per_gpu_hour, share=share, mode=request.price_mode, model=gpu.model)
        if price > request.max_price_per_hour + 1e-9:
            what = "spot price over bid" if request.mode == "spot" else "price over cap"
            return f"{what} {request.max_price_per_hour:g}/h"
        return None


class HostResources(Filter):
    """The node has the host CPU and memory the request asks left (nodes that do not model them pass)."""

    name, scope, node_fields = "host", "node", None  # reads CPU and memory in use: no reason buckets

    def active(self, request):
        return bool(request.cpu_milli or request.memory_mib)

    def check(self, request, node, gpu, view):
        return view.host_fits(node, request)


class Capacity(Filter):
    """A legal MIG placement exists now, or the GPU is free when a whole GPU is needed, or it has the milli
    share asked for left."""

    name, scope, node_fields = "capacity", "gpu", ()

    def check(self, request, node, gpu, view):
        if request.gpu_milli:
            return None if view.milli_free(gpu) >= request.gpu_milli else "not enough of the GPU left to share"
        profile, _ = view.slice_for(gpu, request)
        if profile is None:
            return None if view.is_free(gpu) else "GPU busy"
        return None if view.has_legal_start(gpu, profile) else "no legal placement"


class GpusOnOneNode(Filter):
    """k whole GPUs on one node: the node has at least k free GPUs that pass the other filters."""

    name, scope, node_fields, per_node_free = "gpu_count", "node", (), True

    def active(self, request):
        return request.gpu_count > 1

    # a node whose free schedulable GPUs (any model, `Pool.node_free`) are fewer than k is refused: the
    # reason count may then skip checking it (Scheduler._bucket_reasons)
    bounded_by_node_free = True

    @staticmethod
    def refusal(k: int) -> str:
        return f"fewer than {k} free GPUs on node"

    def check(self, request, node, gpu, view):
        if request.gpu_count <= 1:
            return None
        n = view.free_gpu_count(node, request)
        return None if n >= request.gpu_count else self.refusal(request.gpu_count)


# What the model offers first (the biggest, cheapest-to-count groups), then the node, then the GPU itself.
DEFAULT_FILTERS: tuple[Filter, ...] = (
    ModelAllowed(), ComputeCapability(), MemoryPerSlice(),
    NodeOnline(), RegionAllowed(), CudaVersion(), RunsImage(), HostResources(),
    GpuHealthy(), PriceCap(), Capacity(), GpusOnOneNode(),
)
