"""Loading the openb traces (Alibaba GPU-sharing cluster, FGD paper artifact) into plain `Pod` records.

Every row of a pod file ends up either as a `Pod` or as a counted reason in `TraceLoad.skipped`; rows whose
arrival or runtime had to be invented are counted in `TraceLoad.synthesized`. Nothing is dropped silently,
because a replay that quietly loses 11% of its demand (the trace's Pending pods) is not the trace.

Runtime = deletion_time - scheduled_time (the time the pod actually held its GPU), arrival = creation_time.
Files without time columns (`openb_pod_list_multigpu20.csv`) get Poisson arrivals at the donor trace's mean
rate and runtimes drawn from the donor's empirical runtimes, seeded, so two runs give the same replay.
"""
from __future__ import annotations

import csv
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMNS = ("creation_time", "deletion_time", "scheduled_time")
DEFAULT_DONOR = "openb_pod_list_default.csv"

# Reasons, as they appear in reports.
SKIP_MALFORMED = "malformed row"
SKIP_CPU_ONLY = "no GPU requested (CPU-only pod)"
SKIP_BAD_MILLI = "gpu_milli outside 1..1000"
SKIP_NO_ARRIVAL = "no usable creation_time"
SKIP_NEVER_RAN = "no scheduled_time (never ran in the trace)"
SKIP_BAD_RUNTIME = "runtime <= 0"
SYNTH_NO_TIMES = "file has no time columns: arrival and runtime synthesized"
SYNTH_NEVER_RAN = "no scheduled_time: runtime synthesized"
SYNTH_BAD_RUNTIME = "runtime <= 0: runtime synthesized"


@dataclass(frozen=True)
class Pod:
    name: str
    num_gpu: int
    gpu_milli: int  # thousandths of one GPU per GPU; 1000 = a whole GPU
    gpu_spec: tuple[str, ...]  # allowed trace models ("T4", "G2"); empty = any
    qos: str
    arrival: float  # seconds from the trace's start
    runtime: float  # seconds the pod holds its GPU once started
    synthetic_runtime: bool = False

    @property
    def gpu_share(self) -> float:
        """GPUs this pod asks for, as a number of whole GPUs (0.47, 1, 8)."""
        return self.num_gpu * self.gpu_milli / 1000


@dataclass
class TraceLoad:
    path: str
    rows: int = 0
    pods: list[Pod] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    synthesized: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"path": self.path, "rows": self.rows, "pods": len(self.pods),
                "skipped": dict(self.skipped), "synthesized": dict(self.synthesized), "notes": self.notes}


def _usable_runtimes(path: Path) -> list[float]:
    """Runtimes (deletion - scheduled) of the GPU pods that replay as they are in the trace."""
    out: list[float] = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            try:
                if int(row["num_gpu"]) <= 0 or not 0 < int(row["gpu_milli"]) <= 1000:
                    continue
                float(row["creation_time"])  # the donor pool is the runtimes of rows that replay as is
                runtime = float(row["deletion_time"]) - float(row["scheduled_time"])
            except (KeyError, TypeError, ValueError):
                continue
            if runtime > 0:
                out.append(runtime)
    return out


def _time_span(path: Path) -> tuple[int, float]:
    """(GPU pods, last creation_time) of a timed trace: its mean arrival rate for synthetic arrivals."""
    count, last = 0, 0.0
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            try:
                if int(row["num_gpu"]) > 0:
                    count += 1
                    last = max(last, float(row["creation_time"]))
            except (KeyError, TypeError, ValueError):
                continue
    return count, last


def load_pods(path: str | Path, *, missing_runtime: str = "skip", seed: int = 0,
              donor: str | Path | None = None, limit: int | None = None) -> TraceLoad:
    """Read a pod list; `missing_runtime` is "skip" or "synthesize" for timed rows lacking a runtime.

    `limit` keeps the first N data rows (a prefix of the file, before any skipping).
    """
    if missing_runtime not in ("skip", "synthesize"):
        raise ValueError(f"missing_runtime must be 'skip' or 'synthesize', not {missing_runtime!r}")
    path = Path(path)
    load = TraceLoad(path=str(path))
    rng = random.Random(seed)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = tuple(reader.fieldnames or ())
        missing = [c for c in POD_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{path.name}: not an openb pod list, missing columns {', '.join(missing)}")
        timed = all(c in header for c in TIME_COLUMNS)
        rows = list(reader)
    if limit is not None:
        rows = rows[:limit]
    load.rows = len(rows)

    donor_path = Path(donor) if donor else None
    own_runtimes = _usable_runtimes(path) if timed else []
    if donor_path is None:
        donor_path = path if own_runtimes else path.with_name(DEFAULT_DONOR)
    donor_runtimes = own_runtimes if donor_path == path else _usable_runtimes(donor_path)
    needs_donor = not timed or missing_runtime == "synthesize"
    if needs_donor and not donor_runtimes:
        raise ValueError(f"no usable runtimes in {donor_path} to synthesize runtimes from")
    if not timed:
        count, span = _time_span(donor_path)
        mean_gap = span / max(count - 1, 1)
        load.notes.append(
            f"{path.name} has no time columns: arrivals are a Poisson process with mean gap {mean_gap:.1f} s "
            f"and runtimes are drawn from the {len(donor_runtimes)} runtimes of {donor_path.name} "
            f"(seed {seed})")
    elif missing_runtime == "synthesize":
        load.notes.append(f"rows without a usable runtime get one drawn from the {len(donor_runtimes)} "
                          f"runtimes of {donor_path.name} (seed {seed})")

    clock = 0.0
    for row in rows:
        try:
            name = row["name"]
            num_gpu = int(row["num_gpu"])
            gpu_milli = int(row["gpu_milli"])
        except (KeyError, TypeError, ValueError):
            load.skipped[SKIP_MALFORMED] += 1
            continue
        if num_gpu <= 0:
            load.skipped[SKIP_CPU_ONLY] += 1
            continue
        if not 0 < gpu_milli <= 1000:
            load.skipped[SKIP_BAD_MILLI] += 1
            continue
        if num_gpu > 1:
            gpu_milli = 1000  # multi-GPU pods take whole GPUs (every such row in openb says 1000)
        spec = tuple(s for s in (row.get("gpu_spec") or "").split("|") if s)
        qos = (row.get("qos") or "").strip() or "LS"
        synthetic = False
        if not timed:
            clock += rng.expovariate(1.0 / mean_gap) if mean_gap > 0 else 0.0
            arrival, runtime = clock, rng.choice(donor_runtimes)
            load.synthesized[SYNTH_NO_TIMES] += 1
            synthetic = True
        else:
            try:
                arrival = float(row["creation_time"])
            except (TypeError, ValueError):
                load.skipped[SKIP_NO_ARRIVAL] += 1
                continue
            try:
                runtime = float(row["deletion_time"]) - float(row["scheduled_time"])
                problem = None if runtime > 0 else (SKIP_BAD_RUNTIME, SYNTH_BAD_RUNTIME)
            except (TypeError, ValueError):
                problem = (SKIP_NEVER_RAN, SYNTH_NEVER_RAN)
            if problem is not None:
                if missing_runtime == "skip":
                    load.skipped[problem[0]] += 1
                    continue
                runtime = rng.choice(donor_runtimes)
                load.synthesized[problem[1]] += 1
                synthetic = True
        load.pods.append(Pod(name, num_gpu, gpu_milli, spec, qos, arrival, runtime, synthetic))
    # Arrival order is the replay order; a stable sort keeps the file's order for equal arrivals.
    load.pods.sort(key=lambda p: p.arrival)
    return load


@dataclass(frozen=True)
class TraceNode:
    name: str
    gpus: int
    model: str  # the trace's model name: "G2", "T4"


def load_nodes(path: str | Path) -> list[TraceNode]:
    """The node list (`sn,cpu_milli,memory_mib,gpu,model`); nodes without GPUs are left out (none in openb)."""
    nodes: list[TraceNode] = []
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            gpus = int(row["gpu"])
            if gpus > 0:
                nodes.append(TraceNode(row["sn"], gpus, row["model"].strip()))
    return nodes
