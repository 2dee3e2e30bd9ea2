"""Putting a replay together: trace -> jobs, node list -> pool, then one replay per policy."""
from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from scheduler.core.model import NodeState

from . import pool as pools
from .bound import allocation_bound
from .errors import SimInputError
from .frag import FragMeter, demand_mix
from .mapping import DEFAULT_MODEL_MAP, demand_for, mapping_notes
from .report import series, summarise
from .policies import factory as policy_factory
from .simulate import Job, PolicyFactory, RunResult, replay, request_for
from .trace import NODE_LIST_NAME, SKIP_CPU_ONLY, TraceLoad, load_nodes, load_pods
from .variants import VARIANT_MODEL_MAP, NodeVariant, PodVariant, measured_shares, resample_pods, variant_nodes

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACE_DIR = REPO_ROOT.parent / "shared" / "traces" / "openb"
DEFAULT_TRACE = "openb_pod_list_default.csv"
T = TypeVar("T")
NODE_LIST = NODE_LIST_NAME  # the node list beside a pod list
HOST_CHOICES = ("ignore", "model")


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
    host: str = "ignore"  # "model": host CPU and memory booked per node, CPU-only pods replayed (pool.py)
    donor: Path | None = None  # pod list a file without time columns borrows runtimes from (default: beside it)
    variant: PodVariant | None = None  # resample the pods' shapes (variants.py)
    nodes_variant: NodeVariant | None = None  # a generated pool instead of `pool` (variants.py)
    node_order: int | None = None  # shuffle the pool's node order with this seed (the same nodes); None: as built

    def to_dict(self) -> dict[str, Any]:
        return {"trace": str(self.trace), "nodes": str(self.node_list), "pool": self.pool,
                "pool_scale": self.pool_scale, "model_map": self.model_map, "load": self.load,
                "limit": self.limit, "missing_runtime": self.missing_runtime, "seed": self.seed,
                "fraction_basis": self.basis, "reference_gb": self.reference_gb,
                "head_protect_s": self.head_protect_s, "window": self.window, "warmup": self.warmup,
                "host": self.host, "donor": str(self.donor) if self.donor else None,
                "variant": self.variant.label if self.variant else None,
                "nodes_variant": self.nodes_variant.label if self.nodes_variant else None,
                "node_order": self.node_order}

    def effective_model_map(self) -> dict[str, str]:
        """The model map demands go through: on a node-list variant, VARIANT_MODEL_MAP under the entries that
        were overridden (those that differ from the default map)."""
        if self.nodes_variant is None:
            return self.model_map
        overridden = {k: v for k, v in self.model_map.items() if DEFAULT_MODEL_MAP.get(k) != v}
        return {**VARIANT_MODEL_MAP, **overridden}

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
    notes: list[str] = field(default_factory=list)  # what the replay changed or left out, for the report

    def nodes(self) -> list[NodeState]:
        return pools.node_states(self.node_specs)

    def host_ledger(self) -> pools.HostLedger:
        return pools.HostLedger(self.node_specs)


def prepare(config: SimConfig) -> Prepared:
    """Load the trace and the pool; every input it cannot replay is a SimInputError saying what to do."""
    if config.load <= 0:
        raise SimInputError("--load must be > 0")
    if config.host not in HOST_CHOICES:
        raise SimInputError(f"--host must be one of {', '.join(HOST_CHOICES)}, not {config.host!r}")
    if not 0 <= config.warmup < 1:
        raise SimInputError("--warmup is a quantile in [0, 1)")
    trace = load_pods(config.trace, missing_runtime=config.missing_runtime, seed=config.seed,
                      limit=config.limit, donor=config.donor,
                      cpu_only="replay" if config.host == "model" else "skip")
    if config.variant is not None:
        trace.pods = resample_pods(trace.pods, config.variant)
        got = measured_shares(trace.pods)
        trace.notes.append(f"variant {config.variant.label}: pod shapes redrawn (timing kept); GPU pods now "
                           + ", ".join(f"{k} {v:.1%}" for k, v in got.items()))
    mapping = config.effective_model_map()
    notes: list[str] = []
    if config.nodes_variant is not None:
        specs = variant_nodes(config.nodes_variant)
    elif config.pool == "openb":
        trace_nodes = load_nodes(config.node_list)
        specs = pools.openb_pool(trace_nodes, config.model_map, scale=config.pool_scale)
        notes += mapping_notes({n.model for n in trace_nodes}, config.model_map)
    elif config.pool == "modern":
        specs = pools.modern_pool(scale=config.pool_scale)
    else:
        raise SimInputError(f"--pool must be 'openb' or 'modern', not {config.pool!r}")
    if config.host == "model":
        pools.HostLedger(specs)  # refuses a pool without host figures now, not in the first replay
    jobs = [Job(i, pod, None if pod.cpu_only else demand_for(
                pod.num_gpu, pod.gpu_milli, pod.gpu_spec, pod.qos, mapping=mapping, basis=config.basis,
                reference_gb=config.reference_gb), pod.arrival / config.load)
            for i, pod in enumerate(trace.pods)]
    gpu_jobs = [j for j in jobs if j.demand is not None]
    if not gpu_jobs:
        raise SimInputError(
            f"{Path(config.trace).name}: no GPU jobs to replay in {trace.rows} rows ("
            + ", ".join(f"{n} {why}" for why, n in trace.skipped.items()) + ")", field="trace")
    if trace.skipped.get(SKIP_CPU_ONLY):
        notes.append(f"{trace.skipped[SKIP_CPU_ONLY]} CPU-only pods skipped and host CPU and memory not "
                     f"modelled: traces that differ only in their CPU-only pods or CPU sizes replay alike; "
                     f"--host model replays them")
    arrivals = [j.arrival for j in gpu_jobs]  # jobs are in arrival order
    start = arrivals[int(config.warmup * len(arrivals))] if arrivals else 0.0
    end = (arrivals[-1] if arrivals else 0.0) if config.window == "arrivals" else math.inf
    frag = FragMeter(demand_mix((j.demand for j in gpu_jobs), {s.model for s in specs}))
    prepared = Prepared(config, trace, jobs, specs, (start, end), frag, notes)
    return prepared if config.node_order is None else reordered(prepared, config.node_order)


def shuffled(items: Sequence[T], seed: int) -> list[T]:
    """`items` in the order `random.Random(seed)` shuffles them to (a new list)."""
    out = list(items)
    random.Random(seed).shuffle(out)
    return out


def reordered(prepared: Prepared, seed: int) -> Prepared:
    """The same replay with the pool's nodes in another order (`shuffled` with `seed`). Only the order changes:
    every policy that breaks ties by pool order (first-fit, best-fit, ours) then breaks them differently, which
    is how much a single replay's comparison owes to the order. The trace, jobs, window and yardstick are shared
    (none depends on the order)."""
    return dataclasses.replace(prepared, config=dataclasses.replace(prepared.config, node_order=seed),
                               node_specs=shuffled(prepared.node_specs, seed),
                               notes=[*prepared.notes, f"node order shuffled with seed {seed}"])


def run_policy(prepared: Prepared, name: str, factory: PolicyFactory) -> RunResult:
    host = prepared.host_ledger if prepared.config.host == "model" else None
    return replay(name, factory, prepared.nodes, prepared.jobs, window=prepared.window,
                  head_protect_s=prepared.config.head_protect_s, frag=prepared.frag, host_factory=host)


def run_all(prepared: Prepared, factories: dict[str, PolicyFactory],
            progress: Callable[[str], None] | None = None) -> list[RunResult]:
    results = []
    for name, factory in factories.items():
        if progress:
            progress(f"replaying {len(prepared.jobs)} jobs with {name} ...")
        results.append(run_policy(prepared, name, factory))
    return results


def capacity_bound(prepared: Prepared, results: list[RunResult] = ()) -> float:
    """bound.allocation_bound for this run: the most allocation any policy could average over its window.

    Jobs whose shape fits no GPU of the empty pool are left out; with `--window drain` the window ends
    where the longest of `results` ended."""
    _, probe = policy_factory("best-fit")(prepared.nodes())
    fits: dict[tuple, bool] = {}

    def fits_empty(job: Job) -> bool:
        key = job.demand.key
        if key not in fits:
            fits[key] = probe.decide(request_for(job), explain=False).ok
        return fits[key]
    start, end = prepared.window
    if not math.isfinite(end):
        end = start + max((r.averages.span for r in results if r.averages), default=0.0)
    capacity = sum(s.gpus for s in prepared.node_specs)
    return allocation_bound(prepared.jobs, capacity, (start, end), fits=fits_empty)


def payload(prepared: Prepared, results: list[RunResult]) -> dict[str, Any]:
    """Everything a report needs, as JSON-ready data."""
    bound = round(capacity_bound(prepared, results), 6)
    return {
        "allocation_bound": bound,
        "config": prepared.config.to_dict(),
        "trace": prepared.trace.to_dict(),
        "pool": pools.pool_summary(prepared.node_specs),
        "notes": prepared.notes,
        "window_s": [prepared.window[0], prepared.window[1] if math.isfinite(prepared.window[1]) else None],
        "policies": [dict(summarise(r), allocation_bound=bound, series=series(r)) for r in results],
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
