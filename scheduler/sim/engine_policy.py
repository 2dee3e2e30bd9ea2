"""`ours` in the inflation protocol: the engine itself (scheduler.core.engine.Scheduler) on a pool built from the
openb node list, each GPU not in MIG mode and shared by milli, each node with its CPU and memory.

A GPU pod becomes an engine `Request` (a share: `gpu_milli`; several GPUs: `gpu_count` whole; both with
`cpu_milli` and `memory_mib`; a pinned pod: `models`), decided by `Scheduler.place` with the default filters,
scorers and weights; the pool scores packing by FGD's fragmentation with the pod list's workload
(`Pool.use_workload`). The engine sells GPUs, so a pod that asks no GPU (13% of each openb list) is put by
this adapter on the node whose fragmentation grows least (FGD's rule and integer points, the same measure;
ties as the engine's: the model more of the workload may use, then a hash of the pod's number and the node)
and held on the pool with `Pool.hold_host`. Every placement is mirrored on the protocol's `FractionalCluster`,
which keeps the allocation the protocol records and refuses anything over capacity a second time.

The openb GPU models become catalog keys with MIG off, as labels only (`LABELS`): nothing of a model but its
identity enters the protocol. Node prices are set per performance unit (the model's PU × $2 per PU-hour of the
reference), so the price term is alike on every node, as are region, reliability and interruptions: what
the engine decides on here is packing, which is what the protocol measures.
"""
from __future__ import annotations

import zlib

import numpy as np

from nodeagent.hardware.gpus import GPU_MODELS
from scheduler.core.engine import Pool, Scheduler
from scheduler.core.fractional import FracPod, FractionalCluster, WorkloadMix
from scheduler.core.milli_frag import sigmoid_score
from scheduler.core.model import GpuState, NodeState, Request

# openb model -> catalog key used as its label (MIG off everywhere); distinct so pinned pods keep their model
LABELS = {"P100": "p100", "T4": "t4", "V100M16": "v100", "V100M32": "l20", "A10": "a10", "G2": "l40s",
          "G3": "l4"}


def labels_for(models) -> dict[str, str]:
    """`LABELS`, plus a spare catalog key for each other model name (hand-made clusters, other node lists)."""
    out = dict(LABELS)
    spare = [k for k in sorted(GPU_MODELS) if k not in out.values()]
    for m in sorted(set(models) - set(out)):
        if not spare:
            raise ValueError(f"more GPU models than catalog keys to label them: {m!r} has none")
        out[m] = spare.pop(0)
    return out


class EnginePolicy:
    """The engine deciding the protocol's pods (see the module docstring); the `PaperPolicy` interface."""

    name = "ours"
    memory = True  # the measure counts GPUs stranded behind exhausted node memory too (the filters check it)

    def __init__(self, cluster: FractionalCluster, *, mix: WorkloadMix, seed: int = 0) -> None:
        self.cluster = cluster
        self.labels = labels = labels_for(n.model for n in cluster.nodes)
        nodes = []
        for i, n in enumerate(cluster.nodes):
            label = labels[n.model]
            nodes.append(NodeState(id=n.id, region="openb", cpu_milli=n.cpu_milli, memory_mib=n.memory_mib,
                                   gpus=[GpuState(uuid=f"{i}:{g}", node_id=n.id, model=label, geometry=None)
                                         for g in range(n.gpus)]))
        self.pool = Pool(nodes, copy=False)
        ref = self.pool.pu("a100-80gb", None)
        for node in nodes:
            if node.gpus:
                node.price_per_gpu_hour = 2.0 * self.pool.pu(node.gpus[0].model, None) / ref
            self.pool.set_node(node.id)  # re-key with the price per PU
        self.pool.use_workload(mix.relabelled(lambda m: labels.get(m, m)), memory=self.memory)
        self.sched = Scheduler(self.pool)
        self._node_no = {n.id: i for i, n in enumerate(cluster.nodes)}
        self._cpu_only: dict[tuple, dict[int, float]] = {}
        self.count = 0

    def place(self, pod: FracPod) -> bool:
        if not pod.num_gpu:
            return self._place_cpu_only(pod)
        self.count += 1
        req = Request(gpu_milli=pod.gpu_milli if pod.shared else 0, gpu_count=pod.num_gpu,
                      whole_gpu=not pod.shared, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib,
                      models=None if pod.models is None else frozenset(self.labels.get(m, m) for m in pod.models),
                      lease_id=f"p{self.count}")
        d = self.sched.place(req, allow_preemption=False, explain=False)
        if not d.ok:
            return False
        i = self._node_no[d.placements[0].node_id]
        self.cluster.allocate(i, pod, [int(p.gpu_uuid.split(":")[1]) for p in d.placements])
        return True

    def _place_cpu_only(self, pod: FracPod) -> bool:
        c = self.cluster
        feas = c.feasible(pod)
        if not len(feas):
            return False
        frag = self.pool.milli_frag
        assert frag is not None
        memo = self._cpu_only.setdefault((pod.cpu_milli, pod.memory_mib), {})
        ids = c.state_id[feas]
        deltas = np.empty(len(feas))
        for j, sid in enumerate(ids):
            d = memo.get(int(sid))
            if d is None:
                model, gpus, cpu, mem = c.states[sid]
                label = self.labels[model]
                d = memo[int(sid)] = sigmoid_score(frag(label, gpus, cpu, mem)
                                                   - frag(label, gpus, cpu - pod.cpu_milli, mem - pod.memory_mib))
            deltas[j] = d
        self.count += 1
        best = feas[deltas == deltas.max()]
        # ties as the engine's (milli_path): the model more of the workload may use, then a hash
        access = frag.mix.access_share
        i = int(min(best, key=lambda n: (-access(self.labels[c.nodes[n].model]),
                                         zlib.crc32(f"c{self.count}:{n}".encode()))))
        self.pool.hold_host(c.nodes[i].id, pod.cpu_milli, pod.memory_mib)
        c.allocate(i, pod, [])
        return True

