"""Loading the openb traces (Alibaba GPU-sharing cluster, FGD paper artifact) into plain `Pod` records.

Every row of a pod file ends up either as a `Pod` or as a counted reason in `TraceLoad.skipped`; rows whose
arrival or runtime had to be invented are counted in `TraceLoad.synthesized`. Nothing is dropped silently,
because a replay that quietly loses 11% of its demand (the trace's Pending pods) is not the trace.

Runtime = deletion_time - scheduled_time (the time the pod actually held its GPU), arrival = creation_time.
Files without time columns (`openb_pod_list_multigpu20.csv`) get Poisson arrivals at the donor trace's mean
rate and runtimes drawn from the donor's empirical runtimes, seeded, so two runs give the same replay.

A file that is missing or is not what it should be is a `SimInputError` saying which file and what to do,
never a raw FileNotFoundError or KeyError.
"""
from __future__ import annotations

import csv
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .errors import SimInputError

POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMNS = ("creation_time", "deletion_time", "scheduled_time")
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
DEFAULT_DONOR = "openb_pod_list_default.csv"
NODE_LIST_NAME = "openb_node_list_gpu_node.csv"
CPU_ONLY_CHOICES = ("skip", "replay")

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
    cpu_milli: int = 0  # host CPU the pod asks for (thousandths of a core); replayed only with host modelling
    memory_mib: int = 0  # host memory

    @property
    def cpu_only(self) -> bool:
        return self.num_gpu == 0

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
                "cpu_only_pods": sum(1 for p in self.pods if p.cpu_only),
                "skipped": dict(self.skipped), "synthesized": dict(self.synthesized), "notes": self.notes}


def _rows(path: Path, what: str, hint: str = "") -> Iterator[dict]:
    """The rows of a CSV file, or a SimInputError naming the file, what it was wanted for and what to do."""
    try:
        f = path.open(newline="")
    except FileNotFoundError:
        raise SimInputError(f"{what} {path} not found{hint}", field=what) from None
    except OSError as e:
        raise SimInputError(f"{what} {path} cannot be read: {e.strerror}", field=what) from None
    with f:
        yield from csv.DictReader(f)


def _donor_rows(path: Path) -> Iterator[dict]:
    return _rows(path, "donor pod list",
                 f" (a pod list without time columns borrows arrivals and runtimes from it): put "
                 f"{DEFAULT_DONOR} beside the trace or pass --donor PATH")


def _usable_runtimes(path: Path) -> list[float]:
    """Runtimes (deletion - scheduled) of the GPU pods that replay as they are in the trace."""
    out: list[float] = []
    for row in _donor_rows(path):
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
    for row in _donor_rows(path):
        try:
            if int(row["num_gpu"]) > 0:
                count += 1
                last = max(last, float(row["creation_time"]))
        except (KeyError, TypeError, ValueError):
            continue
    return count, last


def _asks_gpu(row: dict) -> bool:
    try:
        return int(row["num_gpu"]) > 0
    except (KeyError, TypeError, ValueError):
        return False


def load_pods(path: str | Path, *, missing_runtime: str = "skip", seed: int = 0,
              donor: str | Path | None = None, limit: int | None = None, cpu_only: str = "skip") -> TraceLoad:
    """Read a pod list; `missing_runtime` is "skip" or "synthesize" for timed rows lacking a runtime.

    `limit` keeps the file's rows up to and including its N-th row that asks for a GPU (a prefix of the file:
    a trace that opens with CPU-only rows still yields N GPU jobs, not zero). `cpu_only` "replay" keeps
    CPU-only pods as jobs (for a replay that models host CPU and memory); "skip" counts them as skipped.
    """
    if missing_runtime not in ("skip", "synthesize"):
        raise SimInputError(f"missing_runtime must be 'skip' or 'synthesize', not {missing_runtime!r}")
    if cpu_only not in CPU_ONLY_CHOICES:
        raise SimInputError(f"cpu_only must be one of {CPU_ONLY_CHOICES}, not {cpu_only!r}")
    if limit is not None and limit <= 0:
        raise SimInputError(f"--limit must be a positive number of GPU rows, not {limit}")
    path = Path(path)
    load = TraceLoad(path=str(path))
    rng = random.Random(seed)
    reader = _rows(path, "pod list")
    rows: list[dict] = []
    gpu_rows = 0
    for row in reader:
        if not rows:
            header = tuple(row)
            missing = [c for c in POD_COLUMNS if c not in header]
            if missing:
                raise SimInputError(f"{path.name}: not an openb pod list, missing columns {', '.join(missing)}")
            timed = all(c in header for c in TIME_COLUMNS)
        rows.append(row)
        gpu_rows += _asks_gpu(row)
        if limit is not None and gpu_rows >= limit:
            reader.close()
            break
    if not rows:
        raise SimInputError(f"{path.name}: no pod rows (an openb pod list has the header {','.join(POD_COLUMNS)},...)")
    load.rows = len(rows)

    donor_path = Path(donor) if donor else None
    own_runtimes = _usable_runtimes(path) if timed else []
    if donor_path is None:
        donor_path = path if own_runtimes else path.with_name(DEFAULT_DONOR)
    needs_donor = not timed or missing_runtime == "synthesize"
    donor_runtimes = own_runtimes if donor_path == path or not needs_donor else _usable_runtimes(donor_path)
    if needs_donor and not donor_runtimes:
        raise SimInputError(f"no usable runtimes in {donor_path} to synthesize runtimes from")
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
            cpu_milli = int(row["cpu_milli"] or 0)
            memory_mib = int(row["memory_mib"] or 0)
        except (KeyError, TypeError, ValueError):
            load.skipped[SKIP_MALFORMED] += 1
            continue
        if num_gpu <= 0:
            if cpu_only == "skip":
                load.skipped[SKIP_CPU_ONLY] += 1
                continue
            num_gpu, gpu_milli = 0, 0
        elif not 0 < gpu_milli <= 1000:
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
        load.pods.append(Pod(name, num_gpu, gpu_milli, spec, qos, arrival, runtime, synthetic,
                             max(cpu_milli, 0), max(memory_mib, 0)))
    # Arrival order is the replay order; a stable sort keeps the file's order for equal arrivals.
    load.pods.sort(key=lambda p: p.arrival)
    return load


@dataclass(frozen=True)
class TraceNode:
    name: str
    gpus: int
    model: str  # the trace's model name: "G2", "T4"
    cpu_milli: int = 0  # host CPU (thousandths of a core); 0 = not given
    memory_mib: int = 0


def load_nodes(path: str | Path) -> list[TraceNode]:
    """The node list (`sn,cpu_milli,memory_mib,gpu,model`); nodes without GPUs are left out (none in openb)."""
    path = Path(path)
    nodes: list[TraceNode] = []
    rows = _rows(path, "node list", f" (a pod list's nodes are read from {NODE_LIST_NAME} beside it): pass "
                                    f"--nodes PATH, or --pool modern to replay on the modern pool instead")
    for i, row in enumerate(rows, start=2):
        if i == 2:
            missing = [c for c in NODE_COLUMNS if c not in row]
            if missing:
                raise SimInputError(f"{path.name}: not an openb node list, missing columns {', '.join(missing)}")
        try:
            gpus = int(row["gpu"])
            cpu_milli, memory_mib = int(row["cpu_milli"] or 0), int(row["memory_mib"] or 0)
        except (TypeError, ValueError):
            raise SimInputError(f"{path.name} line {i}: gpu, cpu_milli and memory_mib must be whole numbers") from None
        if gpus > 0:
            nodes.append(TraceNode(row["sn"], gpus, (row["model"] or "").strip(), cpu_milli, memory_mib))
    return nodes
