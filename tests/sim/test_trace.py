"""Trace parsing: every row is a job or a counted reason; synthesized times are seeded and counted."""
from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.sim import trace as tr

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
ROWS = [
    "p0,1000,1024,1,1000,,LS,Running,0,100,0",          # ok: runtime 100
    "p1,1000,1024,1,460,T4|G2,BE,Running,10,70,20",     # ok: runtime 50 (scheduled 20, deleted 70)
    "p2,1000,1024,0,0,,LS,Running,5,50,5",              # CPU-only
    "p3,1000,1024,x,1000,,LS,Running,5,50,5",           # malformed num_gpu
    "p4,1000,1024,1,1500,,LS,Running,5,50,5",           # gpu_milli > 1000
    "p5,1000,1024,1,0,,LS,Running,5,50,5",              # gpu_milli 0 on a GPU pod
    "p6,1000,1024,1,1000,,BE,Pending,30,40,",           # never scheduled
    "p7,1000,1024,1,1000,,LS,Failed,30,40,40",          # zero runtime
    "p8,1000,1024,1,1000,,LS,Failed,30,40,45",          # negative runtime
    "p9,1000,1024,1,1000,,LS,Running,,40,30",           # no creation time
    "p10,1000,1024,8,1000,,Burstable,Running,3,1003,3", # ok: 8 GPUs, runtime 1000
]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.fixture
def timed(tmp_path: Path) -> Path:
    return write(tmp_path, "pods.csv", HEADER + "\n".join(ROWS) + "\n")


def test_every_bad_row_is_counted_by_reason(timed: Path) -> None:
    load = tr.load_pods(timed)
    assert load.rows == 11
    assert [p.name for p in load.pods] == ["p0", "p10", "p1"]  # sorted by arrival: 0, 3, 10
    assert dict(load.skipped) == {
        tr.SKIP_CPU_ONLY: 1, tr.SKIP_MALFORMED: 1, tr.SKIP_BAD_MILLI: 2, tr.SKIP_NEVER_RAN: 1,
        tr.SKIP_BAD_RUNTIME: 2, tr.SKIP_NO_ARRIVAL: 1,
    }
    assert len(load.pods) + sum(load.skipped.values()) == load.rows
    assert not load.synthesized


def test_runtime_is_deletion_minus_scheduled_and_arrival_is_creation(timed: Path) -> None:
    pods = {p.name: p for p in tr.load_pods(timed).pods}
    assert (pods["p1"].arrival, pods["p1"].runtime) == (10.0, 50.0)
    assert pods["p1"].gpu_spec == ("T4", "G2")
    assert pods["p1"].gpu_share == pytest.approx(0.46)
    assert (pods["p10"].num_gpu, pods["p10"].gpu_share, pods["p10"].runtime) == (8, 8.0, 1000.0)


def test_synthesize_fills_missing_runtimes_from_the_files_own_runtimes(timed: Path) -> None:
    load = tr.load_pods(timed, missing_runtime="synthesize", seed=1)
    synth = [p for p in load.pods if p.synthetic_runtime]
    assert {p.name for p in synth} == {"p6", "p7", "p8"}
    assert all(p.runtime in (100.0, 50.0, 1000.0) for p in synth)
    assert load.synthesized == {tr.SYNTH_NEVER_RAN: 1, tr.SYNTH_BAD_RUNTIME: 2}
    assert tr.SKIP_NEVER_RAN not in load.skipped
    assert len(load.pods) + sum(load.skipped.values()) == load.rows


def test_untimed_file_gets_seeded_poisson_arrivals_and_donor_runtimes(tmp_path: Path, timed: Path) -> None:
    untimed = write(tmp_path, "multi.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                    "a,1,1,1,1000\nb,1,1,2,1000\nc,1,1,0,0\nd,1,1,1,230\n")
    a = tr.load_pods(untimed, donor=timed, seed=7)
    b = tr.load_pods(untimed, donor=timed, seed=7)
    assert [(p.arrival, p.runtime) for p in a.pods] == [(p.arrival, p.runtime) for p in b.pods]
    assert a.synthesized == {tr.SYNTH_NO_TIMES: 3} and a.skipped == {tr.SKIP_CPU_ONLY: 1}
    arrivals = [p.arrival for p in a.pods]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    assert all(p.runtime in (100.0, 50.0, 1000.0) and p.synthetic_runtime for p in a.pods)
    assert any("Poisson" in n for n in a.notes)
    assert tr.load_pods(untimed, donor=timed, seed=8).pods[0].arrival != arrivals[0]


def test_limit_keeps_a_prefix_of_the_rows_up_to_the_nth_gpu_row(timed: Path) -> None:
    load = tr.load_pods(timed, limit=3)  # p0, p1 and p4 ask for GPUs; p2 (CPU-only) and p3 (malformed) do not
    assert load.rows == 5
    assert [p.name for p in load.pods] == ["p0", "p1"]
    assert load.skipped == {tr.SKIP_CPU_ONLY: 1, tr.SKIP_MALFORMED: 1, tr.SKIP_BAD_MILLI: 1}


def test_a_file_that_is_not_a_pod_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing columns"):
        tr.load_pods(write(tmp_path, "x.csv", "sn,gpu,model\nn,1,T4\n"))


def test_node_list_parses(tmp_path: Path) -> None:
    p = write(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,T4\nn1,1,1,0,\nn2,1,1,8,G2\n")
    assert tr.load_nodes(p) == [tr.TraceNode("n0", 2, "T4", 1, 1), tr.TraceNode("n2", 8, "G2", 1, 1)]


def test_the_real_default_trace_accounts_for_every_row() -> None:
    path = Path(__file__).resolve().parents[3] / "shared" / "traces" / "openb" / "openb_pod_list_default.csv"
    if not path.exists():
        pytest.skip(f"openb traces not at {path}")
    load = tr.load_pods(path)
    assert load.rows == 8152
    assert load.skipped == {tr.SKIP_CPU_ONLY: 1088, tr.SKIP_NEVER_RAN: 861}
    assert len(load.pods) == 6203
