"""Profile choice, start choice (the lowest legal start unless another grows fragmentation much less), whole and
k-GPU placement."""
from __future__ import annotations

import pytest

from scheduler.core import fragmentation as FR
from nodeagent.hardware import mig
from scheduler.core.engine import Pool, Scheduler
from scheduler.core.model import Request
from scheduler.core.weights import Weights

from .pools import gpu, node

PACK_ONLY = Weights(packing=1.0)


def only_packing(nodes, **kw) -> Scheduler:
    return Scheduler(Pool(nodes), weights=PACK_ONLY, adapt_weights=False, **kw)


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
@pytest.mark.parametrize("memory,compute,profile", [
    (5, 1, "1g.10gb"), (15, 1, "1g.20gb"), (15, 2, "2g.20gb"), (30, 1, "3g.40gb"), (40, 4, "4g.40gb"),
    (70, 1, "7g.80gb"),
])
def test_the_smallest_profile_that_fits_memory_and_compute_is_chosen(mode, memory, compute, profile):
    d = only_packing([node("n", gpu("g"))], mode=mode).decide(Request(memory_gb=memory, compute_slices=compute))
    assert d.ok and d.placements[0].profile == profile


def distribution(**probs):
    return tuple(sorted(probs.items()))


@pytest.mark.parametrize("placed,dist,expected", [
    ([], distribution(**{"7g.80gb": 1.0}), 0.0),
    ([("1g.10gb", 0)], distribution(**{"7g.80gb": 1.0}), 7 / 8),
    ([("1g.10gb", 0)], distribution(**{"4g.40gb": 1.0}), 7 / 8),  # 4g only at 0: nothing usable
    ([("1g.10gb", 6)], distribution(**{"4g.40gb": 1.0}), 3 / 8),  # 4g fits at 0; slices 4, 5, 7 stranded
    ([], distribution(**{"1g.10gb": 1.0}), 1 / 8),  # slot 7 is never a 1g.10gb start
    ([("4g.40gb", 0), ("3g.40gb", 4)], distribution(**{"1g.10gb": 1.0}), 0.0),  # nothing free
])
def test_frag_is_the_expected_free_share_a_typical_request_cannot_use(placed, dist, expected):
    insts = [mig.Instance(p, s) for p, s in placed]
    assert FR.frag(mig.A100_80GB, insts, dist) == pytest.approx(expected)


def test_a_1g_is_placed_where_it_keeps_the_4g_start_free_when_4g_is_in_demand():
    mix = FR.DemandMix(refresh_every=1)
    for _ in range(200):
        mix.observe(Request(memory_gb=40, compute_slices=4))
    pool = Pool([node("n", gpu("g"))], mix=mix)
    d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False).decide(Request(memory_gb=5))
    assert d.placements[0].profile == "1g.10gb" and d.placements[0].start >= 4


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
@pytest.mark.parametrize("other,least,taken", [
    ((30, 1), 6, 0),  # 3g.40gb demand: slot 6 saves 0.01 of Δfrag, too little to leave the lowest start
    ((40, 4), 6, 4),  # 4g.40gb demand: slot 0 would take the only 4g start (+0.3); 4 is the lowest start close to 6
])
def test_a_slice_takes_the_lowest_legal_start_unless_another_grows_fragmentation_much_less(
        monkeypatch, mode, other, least, taken):
    def start(tolerance):
        monkeypatch.setattr(FR, "START_TOLERANCE", tolerance)
        mix = FR.DemandMix(refresh_every=1)
        for _ in range(200 if other == (40, 4) else 50):
            mix.observe(Request(memory_gb=other[0], compute_slices=other[1]))
        for _ in range(100):
            mix.observe(Request(memory_gb=5))
        pool = Pool([node("n", gpu("g"))], mix=mix)
        d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode=mode).decide(Request(memory_gb=5))
        assert d.ok and d.placements[0].profile == "1g.10gb"
        return d.placements[0].start

    assert start(FR.START_TOLERANCE) == taken
    assert start(0.0) == least  # the least-Δfrag start (the rule until issue 12 §2 round eight)


def test_a_slice_goes_to_the_gpu_it_completes_rather_than_a_fresh_one():
    # g-part holds a 4g at 0 and a 2g at 4: a 1g.20gb at 6 completes it; a fresh GPU would be cut into
    nodes = [node("n", gpu("fresh"), gpu("part", instances=[("4g.40gb", 0), ("2g.20gb", 4)]))]
    d = only_packing(nodes).decide(Request(memory_gb=15))
    assert d.placements[0].gpu_uuid == "part" and d.placements[0].start == 6


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
def test_a_whole_gpu_request_prefers_a_non_mig_gpu_where_gangs_are_seen(mode):
    # the keep charge is for gangs (placement.gang_keep; without them see tests/core/test_gang_keep.py)
    # (the MIG node has four GPUs: the 4-GPU gangs could run there, so their demand is charged for)
    nodes = [node("m", *[gpu(f"mig{i}", "a100-80gb") for i in range(4)]),
             node("w", gpu("plain", "a100-80gb", mig_on=False))]
    sched = only_packing(nodes, mode=mode)
    for _ in range(10):
        sched.pool.mix.observe(Request(gpu_count=4))
    sched.pool.mix.refresh()
    d = sched.decide(Request(whole_gpu=True))
    assert d.placements == [d.placements[0]] and d.placements[0].gpu_uuid == "plain"
    assert d.placements[0].profile is None


def test_a_whole_gpu_on_a_mig_gpu_needs_no_instances_on_it():
    nodes = [node("m", gpu("busy", instances=[("1g.10gb", 6)]), gpu("empty"))]
    d = only_packing(nodes).decide(Request(whole_gpu=True))
    assert d.placements[0].gpu_uuid == "empty"


def test_a_slice_on_a_gpu_without_mig_takes_the_whole_gpu():
    d = only_packing([node("n", gpu("l4", "l4", mig_on=False))]).decide(Request(memory_gb=8))
    assert d.ok and d.placements[0].profile is None


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
def test_k_gpus_land_on_one_node_with_k_free_gpus(mode):
    nodes = [node("a", gpu("a0"), gpu("a1", instances=[("1g.10gb", 0)]), gpu("a2")),
             node("b", gpu("b0"), gpu("b1"), gpu("b2"))]
    d = only_packing(nodes, mode=mode).decide(Request(gpu_count=3))
    assert d.ok and {p.node_id for p in d.placements} == {"b"} and len({p.gpu_uuid for p in d.placements}) == 3


def test_k_gpus_take_free_gpus_and_leave_a_part_used_one():
    n = node("a", gpu("m0", instances=[("1g.10gb", 0)]), gpu("m1"), gpu("p0", mig_on=False))
    d = only_packing([n]).decide(Request(gpu_count=2))
    assert sorted(p.gpu_uuid for p in d.placements) == ["m1", "p0"]


def test_demand_mix_learns_from_requests_and_keeps_a_prior():
    mix = FR.DemandMix(refresh_every=10)
    before = dict(mix.distribution("a100-80gb"))
    assert sum(before.values()) == pytest.approx(1.0) and before["1g.10gb"] > before["7g.80gb"]
    for _ in range(10):
        mix.observe(Request(memory_gb=70))
    after = dict(mix.distribution("a100-80gb"))
    assert after["7g.80gb"] > before["7g.80gb"] and after["1g.10gb"] > 0


def test_demand_mix_snapshot_changes_only_on_refresh():
    mix = FR.DemandMix(refresh_every=100)
    snap = mix.distribution("h100-80gb")
    mix.observe(Request(memory_gb=70))
    assert mix.distribution("h100-80gb") == snap
    mix.refresh()
    assert mix.distribution("h100-80gb") != snap
