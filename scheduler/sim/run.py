"""Putting a replay together: trace -> jobs, node list -> pool, then one replay per policy."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from scheduler.core.model import NodeState

from . import pool as pools
from .frag import FragMeter, demand_mix
from .mapping import DEFAULT_MODEL_MAP, demand_for
from .report import series, summarise
from .simulate import Job, PolicyFactory, RunResult, replay
from .trace import TraceLoad, load_nodes, load_pods

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACE_DIR = REPO_ROOT.parent / "shared" / "traces" / "openb"
DEFAULT_TRACE = "openb_pod_list_default.csv"
NODE_LIST = "openb_node_list_gpu_node.csv"


@dataclass
class SimConfig:
    trace: Path = DEFAULT_TRACE_DIR / DEFAULT_TRACE
    nodes: Path | None = None  # default: the node list beside the trace
    pool: str = "openb"  # "openb" (node list through model_map) or "modern" (DESIGN §9)
    pool_scale: float = 0.02  # openb at full size asks for ~1% of its 6,212 GPUs: see pool.py
    model_map: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_MODEL_MAP))
    load: float = 1.0  # arrival-rate multiplier: arrival times are divided by it
    limit: int | None = None
    missing_runtime: str = "skip"
    seed: int = 0
    basis: str = "memory"
    reference_gb: float = 80.0
    head_protect_s: float | None = 3600.0
    window: str = "arrivals"  # "arrivals" (until the last arrival) or "drain" (until the last completion)
    warmup: float = 0.01  # the metric window opens at the arrival of this quantile of the jobs (metrics.py)

    def to_dict(self) -> dict[str, Any]:
        return {"trace": str(self.trace), "nodes": str(self.node_list), "pool": self.pool,
                "pool_scale": self.pool_scale, "model_map": self.model_map, "load": self.load,
                "limit": self.limit, "missing_runtime": self.missing_runtime, "seed": self.seed,
                "fraction_basis": self.basis, "reference_gb": self.reference_gb,
                "head_protect_s": self.head_protect_s, "window": self.window, "warmup": self.warmup}

    @property
    def node_list(self) -> Path:
        return self.nodes or Path(self.trace).with_name(NODE_LIST)


@dataclass
class Prepared:
    config: SimConfig
    trace: TraceLoad
    jobs: list[Job]
    node_specs: list[pools.NodeSpec]
    window: tuple[float, float]
    frag: FragMeter

    def nodes(self) -> list[NodeState]:
        return pools.node_states(self.node_specs)


def prepare(config: SimConfig) -> Prepared:
    if config.load <= 0:
        raise ValueError("--load must be > 0")
    trace = load_pods(config.trace, missing_runtime=config.missing_runtime, seed=config.seed,
                      limit=config.limit)
    jobs = [Job(i, pod, demand_for(pod.num_gpu, pod.gpu_milli, pod.gpu_spec, pod.qos, mapping=config.model_map,
                                   basis=config.basis, reference_gb=config.reference_gb),
                pod.arrival / config.load)
            for i, pod in enumerate(trace.pods)]
    if config.pool == "openb":
        specs = pools.openb_pool(load_nodes(config.node_list), config.model_map, scale=config.pool_scale)
    elif config.pool == "modern":
        specs = pools.modern_pool(scale=config.pool_scale)
    else:
        raise ValueError(f"pool must be 'openb' or 'modern', not {config.pool!r}")
    if not 0 <= config.warmup < 1:
        raise ValueError("warmup is a quantile in [0, 1)")
    arrivals = [j.arrival for j in jobs]  # jobs are in arrival order
    start = arrivals[int(config.warmup * len(arrivals))] if arrivals else 0.0
    end = (arrivals[-1] if arrivals else 0.0) if config.window == "arrivals" else math.inf
    frag = FragMeter(demand_mix((j.demand for j in jobs), {s.model for s in specs}))
    return Prepared(config, trace, jobs, specs, (start, end), frag)


def run_policy(prepared: Prepared, name: str, factory: PolicyFactory) -> RunResult:
    return replay(name, factory, prepared.nodes, prepared.jobs, window=prepared.window,
                  head_protect_s=prepared.config.head_protect_s, frag=prepared.frag)


def run_all(prepared: Prepared, factories: dict[str, PolicyFactory],
            progress: Callable[[str], None] | None = None) -> list[RunResult]:
    results = []
    for name, factory in factories.items():
        if progress:
            progress(f"replaying {len(prepared.jobs)} jobs with {name} ...")
        results.append(run_policy(prepared, name, factory))
    return results


def payload(prepared: Prepared, results: list[RunResult]) -> dict[str, Any]:
    """Everything a report needs, as JSON-ready data."""
    return {
        "config": prepared.config.to_dict(),
        "trace": prepared.trace.to_dict(),
        "pool": pools.pool_summary(prepared.node_specs),
        "window_s": [prepared.window[0], prepared.window[1] if math.isfinite(prepared.window[1]) else None],
        "policies": [dict(summarise(r), series=series(r)) for r in results],
    }


def trace_path(value: str) -> Path:
    """A pod list path; a bare openb file name means one of the files in the default trace folder."""
    p = Path(value)
    if not p.exists() and (DEFAULT_TRACE_DIR / value).exists():
        return DEFAULT_TRACE_DIR / value
    return p


def policy_list(text: str, known: Sequence[str]) -> tuple[list[str], str | None]:
    """Comma-separated policy names -> (names, None), or ([], what is wrong) when one is not known."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        return [], f"unknown policies: {', '.join(unknown)}; known: {', '.join(known)}"
    return names, None
