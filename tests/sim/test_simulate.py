"""A small replay whose every number is worked out by hand (the comments show the arithmetic)."""
from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.sim.policies import factory
from scheduler.sim.run import SimConfig, prepare, run_policy

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def pod(name: str, num_gpu: int, milli: int, qos: str, arrival: int, runtime: int) -> str:
    return f"{name},1000,1024,{num_gpu},{milli},,{qos},Running,{arrival},{arrival + runtime},{arrival}"


def write_trace(tmp_path: Path, pods: list[str], nodes: list[tuple[str, int]]) -> SimConfig:
    (tmp_path / "pods.csv").write_text(HEADER + "\n".join(pods) + "\n")
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                                        + "".join(f"{n},64000,262144,{g},G2\n" for n, g in nodes))
    return SimConfig(trace=tmp_path / "pods.csv", nodes=tmp_path / "nodes.csv", pool_scale=1.0, warmup=0.0,
                     head_protect_s=None)


# Two nodes with one A100-80GB each (G2 -> a100-80gb).
SCENARIO = [
    pod("j0", 1, 1000, "LS", 0, 100),  # starts 0 on one GPU, ends 100
    pod("j1", 1, 1000, "LS", 10, 50),  # starts 10 on the other, ends 60
    pod("j2", 2, 1000, "LS", 20, 10),  # 2 GPUs on one node: no node has 2 -> unschedulable, never queued
    pod("j3", 1, 1000, "BE", 30, 40),  # both busy: queued
    pod("j4", 1, 1000, "LS", 40, 10),  # queued behind j3, but LS outranks BE: starts 60 when j1 ends
    pod("j5", 1, 470, "LS", 65, 30),   # 37.6 GB -> 3g.40gb; queued; at 70 (j4 ends) it goes before j3
    pod("j6", 1, 160, "BE", 90, 5),    # 12.8 GB -> 1g.20gb beside j5 at 90: backfills past j3
]


@pytest.fixture
def config(tmp_path: Path) -> SimConfig:
    return write_trace(tmp_path, SCENARIO, [("n0", 1), ("n1", 1)])


@pytest.mark.parametrize("policy", ["ours", "first-fit", "best-fit"])
def test_slice_policies_replay_the_scenario_exactly(config: SimConfig, policy: str) -> None:
    prepared = prepare(config)
    assert prepared.window == (0.0, 90.0)  # first arrival .. last arrival
    r = run_policy(prepared, policy, factory(policy))
    # j3 (BE, waiting since 30) starts only at 100, when j0 and j5 end; job indexes follow arrival order.
    assert r.starts == {0: 0, 1: 10, 3: 100, 4: 60, 5: 70, 6: 90}
    assert sorted(r.waits) == [0, 0, 0, 5, 20, 70]  # j0, j1, j6 | j5 65->70 | j4 40->60 | j3 30->100
    assert r.wait_percentile(50) == 0 and r.wait_percentile(95) == 70 and r.wait_percentile(99) == 70
    assert sum(r.unschedulable.values()) == 1 and r.never_started == 0
    assert r.completed == 6 and r.completed_in_window == 2  # j1 at 60 and j4 at 70 end inside [0, 90]
    avg = r.averages
    # asked-for GPUs x seconds in [0, 90]: j0 90 + j1 50 + j4 10 + j5 0.47 x 20 = 159.4, over 2 GPUs x 90 s
    assert avg.allocation == pytest.approx(159.4 / 180)
    # held: the same but j5's 3g holds 3 of 7 compute slices: 90 + 50 + 10 + 3/7 x 20
    assert avg.held == pytest.approx((150 + 60 / 7) / 180)
    # queue length: 1 on [30,40), 2 on [40,60), 1 on [60,65), 2 on [65,70), 1 on [70,90) -> 85 / 90
    assert avg.mean_queue == pytest.approx(85 / 90)
    assert r.placed_as["1x470 milli -> a100-80gb 3g.40gb"] == 1
    assert r.placed_as["1x160 milli -> a100-80gb 1g.20gb"] == 1


def test_whole_gpu_renting_makes_the_small_job_wait_for_a_whole_gpu(config: SimConfig) -> None:
    r = run_policy(prepare(config), "whole-gpu", factory("whole-gpu"))
    # j5 takes the free GPU whole at 70; j6 finds nothing free until j0 and j5 end at 100, then j3
    # (earlier in FIFO) and j6 both start on the two freed GPUs.
    assert r.starts == {0: 0, 1: 10, 3: 100, 4: 60, 5: 70, 6: 100}
    assert sorted(r.waits) == [0, 0, 5, 10, 20, 70]
    # allocation counts what the jobs asked for, so it is the same as above inside [0, 90] ...
    assert r.averages.allocation == pytest.approx(159.4 / 180)
    # ... but held counts j5's whole GPU: 90 + 50 + 10 + 20 = 170
    assert r.averages.held == pytest.approx(170 / 180)
    assert r.placed_as["1x470 milli -> a100-80gb whole"] == 1


PROTECTION = [
    pod("a", 1, 1000, "LS", 0, 100),   # first fit: n0 GPU 0 until 100
    pod("h", 2, 1000, "LS", 10, 50),   # needs both GPUs of n0: waits
    pod("b", 1, 1000, "LS", 20, 100),  # fits n0 GPU 1 (backfill) or n1
]


@pytest.mark.parametrize("protect, h_start, b_node", [(None, 120, "n0"), (5.0, 100, "n1")])
def test_a_starving_head_reserves_its_node_from_backfill(tmp_path: Path, protect: float | None, h_start: int,
                                                          b_node: str) -> None:
    cfg = write_trace(tmp_path, PROTECTION, [("n0", 2), ("n1", 1)])
    cfg.head_protect_s = protect
    prepared = prepare(cfg)
    from scheduler.sim import simulate

    replay = simulate.Replay("first-fit", factory("first-fit"), prepared.nodes(), prepared.nodes(),
                             [simulate.Job(j.index, j.pod, j.demand, j.arrival) for j in prepared.jobs],
                             window=prepared.window, head_protect_s=protect, frag=prepared.frag)
    r = replay.run()
    # Unprotected, b backfills onto n0 and h needs both n0 GPUs free: 120 when b ends. Protected (h has
    # waited 10 >= 5 s when b arrives), n0 is reserved for h, b goes to n1 and h starts when a ends.
    assert r.starts[1] == h_start
    b = next(j for j in replay.jobs if j.pod.name == "b")
    assert b.placements[0].node_id == b_node and r.starts[2] == 20


def test_load_compresses_arrivals_not_runtimes(config: SimConfig) -> None:
    config.load = 2.0
    prepared = prepare(config)
    assert [j.arrival for j in prepared.jobs] == [0, 5, 10, 15, 20, 32.5, 45]
    assert [j.pod.runtime for j in prepared.jobs] == [100, 50, 10, 40, 10, 30, 5]


GANGS = [
    pod("g1", 2, 1000, "LS", 0, 100),  # both GPUs of n0 at once
    pod("s", 1, 1000, "LS", 5, 200),   # a single: n1 (the pool's only other GPU)
    pod("g2", 2, 1000, "LS", 10, 10),  # n0 is busy: waits until g1 ends at 100
]


def test_the_replay_tells_the_engine_how_long_each_gang_waited(tmp_path: Path) -> None:
    from scheduler.core import fragmentation as FR
    from scheduler.sim import simulate

    prepared = prepare(write_trace(tmp_path, GANGS, [("n0", 2), ("n1", 1)]))
    replay = simulate.Replay("ours", factory("ours"), prepared.nodes(), prepared.nodes(),
                             [simulate.Job(j.index, j.pod, j.demand, j.arrival) for j in prepared.jobs],
                             window=prepared.window, head_protect_s=None, frag=prepared.frag)
    seen: list[float] = []
    real = replay.pool.mix.gang_started
    replay.pool.mix.gang_started = lambda waited_s: (seen.append(waited_s), real(waited_s))  # type: ignore
    r = replay.run()
    assert r.starts[2] == 100
    # each gang's start is reported with its wait (the single's is not): g1 at once, g2 after 90 s; the keep
    # factor eased by the first and moved back towards 1 by the second (fragmentation.KEEP_FALL, KEEP_RISE)
    assert seen == [0.0, 90.0]
    eased = 1 - FR.KEEP_FALL * (1 - FR.KEEP_FLOOR)
    assert replay.pool.mix._keep == pytest.approx(eased + FR.KEEP_RISE * (1 - eased))
