"""Fractional GPU sharing: a GPU not in MIG mode shared by milli-GPU (time-slicing / MPS), beside MIG.

A pod asks for `gpu_milli` thousandths of one GPU (1..1000) on `num_gpu` GPUs of one node (a fraction only
when `num_gpu` is 1; several GPUs are whole), plus host CPU (milli-cores) and memory (MiB) on that node. Any
fraction fits a GPU with that much left; a GPU never holds more than 1000 milli; a node never hands out more
CPU or memory than it has. A pod that names GPU models (`models`) only fits those.

`FractionalCluster` is the state (numpy arrays: one row per node, one column per GPU slot, -1 where a node has
fewer GPUs), with the one filter every policy shares (`feasible`) and the one writer (`allocate`), which
refuses anything over capacity. `WorkloadMix` and `node_frag` (milli_frag.py, shared with the engine's
placement) are FGD's fragmentation measure (Weng et al.,
USENIX ATC '23, §4) on this model: the expected GPU milli of a node that a pod drawn from the workload cannot
use. The MIG measure of the same idea is fragmentation.py; here capacity is milli per GPU instead of memory
slices, and the node's free whole GPUs are in the same sum (a k-GPU pod needs k GPUs with its milli free).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .milli_frag import MILLI, FragTable, WorkloadMix, after_exclusive, after_share, node_frag

__all__ = ["MILLI", "FracNode", "FracPod", "FractionalCluster", "FragTable", "WorkloadMix", "after_exclusive",
           "after_share", "node_frag"]



@dataclass(frozen=True)
class FracNode:
    id: str
    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True)
class FracPod:
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0  # per GPU; 1000 on a multi-GPU pod
    models: frozenset[str] | None = None  # GPU models it may run on; None = any

    def __post_init__(self) -> None:
        if self.num_gpu < 0 or not 0 <= self.gpu_milli <= MILLI:
            raise ValueError(f"a pod asks 0..{MILLI} milli on 0 or more GPUs, not {self.num_gpu} x {self.gpu_milli}")
        if self.num_gpu > 1 and self.gpu_milli != MILLI:
            raise ValueError("a pod on several GPUs takes them whole (gpu_milli 1000)")
        if self.num_gpu and not self.gpu_milli:
            raise ValueError("a GPU pod asks at least 1 milli")

    @property
    def gpu_demand(self) -> int:
        """milli-GPU this pod takes in all."""
        return self.num_gpu * self.gpu_milli

    @property
    def shape(self) -> tuple[int, int, frozenset[str] | None]:
        """What FGD's workload distribution counts: GPUs, milli per GPU, allowed models."""
        return (self.num_gpu, self.gpu_milli if self.num_gpu else 0, self.models)

    @property
    def shared(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI


class FractionalCluster:
    """GPU milli left per GPU, CPU and memory left per node; `allocate` is the only writer."""

    def __init__(self, nodes: Sequence[FracNode]) -> None:
        if not nodes:
            raise ValueError("a cluster needs at least one node")
        self.nodes = list(nodes)
        n, width = len(nodes), max(1, max(x.gpus for x in nodes))
        self.models = sorted({x.model for x in nodes})
        self._model_no = {m: i for i, m in enumerate(self.models)}
        self.model_idx = np.array([self._model_no[x.model] for x in nodes], dtype=np.int32)
        self.gpu_count = np.array([x.gpus for x in nodes], dtype=np.int32)
        self.free = np.full((n, width), -1, dtype=np.int32)  # -1: no GPU in that slot
        for i, x in enumerate(nodes):
            self.free[i, :x.gpus] = MILLI
        self.cpu_cap = np.array([x.cpu_milli for x in nodes], dtype=np.int64)
        self.mem_cap = np.array([x.memory_mib for x in nodes], dtype=np.int64)
        self.cpu_left = self.cpu_cap.copy()
        self.mem_left = self.mem_cap.copy()
        self.gpu_left = self.gpu_count.astype(np.int64) * MILLI
        self.capacity_milli = int(self.gpu_count.sum()) * MILLI
        self.allocated_milli = 0
        self._model_masks: dict[frozenset[str] | None, np.ndarray] = {}
        # node state as FGD sees it (model, GPU milli left sorted, CPU left, memory left): interned, so policies
        # can score a state once
        self.states: list[tuple[str, tuple[int, ...], int, int]] = []
        self._state_no: dict[tuple[str, tuple[int, ...], int, int], int] = {}
        self.state_id = np.array([self._intern(i) for i in range(n)], dtype=np.int32)

    def _intern(self, i: int) -> int:
        key = (self.nodes[i].model, self.gpu_tuple(i), int(self.cpu_left[i]), int(self.mem_left[i]))
        sid = self._state_no.get(key)
        if sid is None:
            sid = self._state_no[key] = len(self.states)
            self.states.append(key)
        return sid

    def gpu_tuple(self, i: int) -> tuple[int, ...]:
        """GPU milli left on node i, ascending (the order FGD's measure does not care about)."""
        return tuple(sorted(int(v) for v in self.free[i, :self.gpu_count[i]]))

    def model_mask(self, models: frozenset[str] | None) -> np.ndarray:
        mask = self._model_masks.get(models)
        if mask is None:
            if models is None:
                mask = np.ones(len(self.nodes), dtype=bool)
            else:
                allowed = [self._model_no[m] for m in models if m in self._model_no]
                mask = np.isin(self.model_idx, allowed)
            self._model_masks[models] = mask
        return mask

    def feasible(self, pod: FracPod) -> np.ndarray:
        """Indexes of the nodes that can take `pod` now: CPU, memory, model, and GPUs with its milli left."""
        ok = (self.cpu_left >= pod.cpu_milli) & (self.mem_left >= pod.memory_mib)
        if pod.num_gpu:
            ok &= self.model_mask(pod.models)
            ok &= (self.free >= pod.gpu_milli).sum(axis=1) >= pod.num_gpu
        return np.flatnonzero(ok)

    def allocate(self, i: int, pod: FracPod, gpus: Sequence[int]) -> None:
        """Put `pod` on node i, GPU slots `gpus`; refuses (changing nothing) what does not fit."""
        if len(gpus) != pod.num_gpu or len(set(gpus)) != len(gpus):
            raise ValueError(f"a {pod.num_gpu}-GPU pod needs {pod.num_gpu} distinct GPUs, got {list(gpus)}")
        if self.cpu_left[i] < pod.cpu_milli or self.mem_left[i] < pod.memory_mib:
            raise ValueError(f"node {self.nodes[i].id} lacks CPU or memory for the pod")
        if pod.num_gpu and not self.model_mask(pod.models)[i]:
            raise ValueError(f"node {self.nodes[i].id} has {self.nodes[i].model}, "
                             f"the pod asks {sorted(pod.models or ())}")
        for g in gpus:
            if not 0 <= g < self.gpu_count[i] or self.free[i, g] < pod.gpu_milli:
                raise ValueError(f"GPU {g} of node {self.nodes[i].id} has not {pod.gpu_milli} milli left")
        self.cpu_left[i] -= pod.cpu_milli
        self.mem_left[i] -= pod.memory_mib
        for g in gpus:
            self.free[i, g] -= pod.gpu_milli
        self.gpu_left[i] -= pod.gpu_demand
        self.allocated_milli += pod.gpu_demand
        self.state_id[i] = self._intern(i)

    def exclusive_gpus(self, i: int, k: int) -> list[int]:
        """The first k wholly free GPU slots of node i (in slot order)."""
        return [int(g) for g in np.flatnonzero(self.free[i, :self.gpu_count[i]] == MILLI)[:k]]

    def best_fit_gpu(self, i: int, milli: int) -> int:
        """The GPU with the least milli left that still holds `milli` (lowest slot on ties)."""
        row = self.free[i, :self.gpu_count[i]]
        fits = np.flatnonzero(row >= milli)
        return int(fits[np.argmin(row[fits])])

    def allocation_ratio(self) -> float:
        return self.allocated_milli / self.capacity_milli
