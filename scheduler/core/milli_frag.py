"""FGD's fragmentation measure on GPUs shared by milli (Weng et al., USENIX ATC '23, §4): the expected GPU milli
of a node that a pod drawn from the workload cannot use. One implementation, used by the engine's placement
(placement.milli_option) and by the paper's policies on `fractional.FractionalCluster`.

The MIG measure of the same idea is fragmentation.py; here capacity is milli per GPU instead of memory slices,
and the node's free whole GPUs are in the same sum (a k-GPU pod needs k GPUs with its milli free). A workload
entry is anything with `shape` ((GPUs, milli per GPU, allowed models)), `cpu_milli` and `memory_mib`.
"""
from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

MILLI = 1000  # one whole GPU in milli-GPU


def sigmoid_score(decrease: float) -> int:
    """The FGD artifact's score: an integer 0..100 of the fragmentation decrease in milli (50 = no change; a point
    is about 40 milli near zero), so near-equal options tie."""
    return int(100.0 / (1.0 + math.exp(-decrease / 1000.0)))


class WorkloadMix:
    """FGD's target workload: each pod shape (GPUs, milli, models, CPU and memory asked) with its share.

    The paper's artifact keys a typical pod by its CPU too (`PodResource`, no memory): a node whose CPU is gone
    cannot run the pod, so its free GPU milli is fragment to it. `with_cpu=False` leaves CPU out. Memory is
    kept per shape; whether the measure checks it is the `FragTable`'s choice."""

    def __init__(self, pods: Iterable[Any], *, with_cpu: bool = True) -> None:
        counts = Counter(p.shape + ((p.cpu_milli if with_cpu else 0), p.memory_mib) for p in pods)
        total = sum(counts.values())
        if not total:
            raise ValueError("the workload has no pods")
        # (num_gpu, milli, models, CPU milli, memory MiB, probability), most frequent first (ties: a fixed order)
        self.entries = [(k, m, models, cpu, mem, n / total) for (k, m, models, cpu, mem), n in
                        sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1], kv[0][3], kv[0][4],
                                                               sorted(kv[0][2] or ())))]

    def access_share(self, model: str) -> float:
        """The share of the workload's GPU pods that may run on `model` (not pinned away from it)."""
        memo = self.__dict__.setdefault("_access", {})
        v = memo.get(model)
        if v is None:
            gpu = [e for e in self.entries if e[0]]
            total = sum(e[-1] for e in gpu)
            v = memo[model] = (sum(e[-1] for e in gpu if e[2] is None or model in e[2]) / total) if total else 1.0
        return v

    def relabelled(self, rename) -> "WorkloadMix":
        """The same mix with each pinned entry's models renamed by `rename` (model -> name)."""
        out = WorkloadMix.__new__(WorkloadMix)
        out.entries = [(k, m, None if models is None else frozenset(rename(x) for x in models), cpu, mem, p)
                       for k, m, models, cpu, mem, p in self.entries]
        return out


def node_frag(model: str, gpus: Sequence[int], mix: WorkloadMix, cpu_left: int | None = None,
              mem_left: int | None = None) -> float:
    """Expected GPU milli of a node (its GPUs' milli left: `gpus`; its CPU left) that a pod drawn from `mix`
    cannot use.

    Per FGD: a pod that asks no GPU, may not run on `model`, lacks CPU, or finds fewer than k GPUs with its
    milli left sees all the node's free milli as fragment; a pod that fits sees as fragment the GPUs with
    less than its milli left. `cpu_left` / `mem_left` None: not checked."""
    total = sum(gpus)
    if not total:
        return 0.0
    out = 0.0
    for k, m, models, cpu, mem, p in mix.entries:
        if (not k or (models is not None and model not in models) or (cpu_left is not None and cpu_left < cpu)
                or (mem_left is not None and mem_left < mem)):
            out += p * total
            continue
        fit = 0
        short = 0
        for v in gpus:
            if v >= m:
                fit += 1
            else:
                short += v
        out += p * (short if fit >= k else total)
    return out


class FragTable:
    """`node_frag` memoised per (model, sorted GPU milli left, CPU class, memory class): node states repeat a
    lot. A class is how many of the mix's asks the CPU (memory) left covers, all the measure reads of it.
    `memory=False` (the paper's measure) does not check memory."""

    def __init__(self, mix: WorkloadMix, *, memory: bool = False) -> None:
        self.mix = mix
        self.memory = memory
        self._cpus = sorted({e[3] for e in mix.entries})
        self._mems = sorted({e[4] for e in mix.entries}) if memory else []
        self._memo: dict[tuple[str, tuple[int, ...], int, int], float] = {}

    def __call__(self, model: str, gpus: tuple[int, ...], cpu_left: int, mem_left: int) -> float:
        key = (model, gpus, bisect.bisect_right(self._cpus, cpu_left), bisect.bisect_right(self._mems, mem_left))
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = node_frag(model, gpus, self.mix, cpu_left, mem_left if self.memory else None)
        return v


def after_share(gpus: tuple[int, ...], j: int, milli: int) -> tuple[int, ...]:
    """`gpus` (sorted) with `milli` taken from its j-th entry, sorted again."""
    out = list(gpus)
    out[j] -= milli
    return tuple(sorted(out))


def after_exclusive(gpus: tuple[int, ...], k: int, milli: int) -> tuple[int, ...] | None:
    """`gpus` (sorted) after a k-GPU pod takes `milli` from the k tightest GPUs that hold it (FGD's Sub)."""
    out = list(gpus)
    left = k
    for j, v in enumerate(out):
        if left and v >= milli:
            out[j] = v - milli
            left -= 1
    return tuple(sorted(out)) if not left else None
