"""The scheduler as a whole: decisions, reasons, breakdowns, pool bookkeeping, purity."""
from __future__ import annotations

import ast
import pathlib

import pytest

from scheduler.core.engine import CapacityError, Pool, Scheduler
from scheduler.core.model import Decision, Placement, Request

from .pools import gpu, node, uniform_nodes

CORE = pathlib.Path(__file__).resolve().parents[2] / "scheduler" / "core"


def test_scheduler_core_imports_nothing_from_django_drf_channels_or_celery():
    banned = {"django", "rest_framework", "channels", "celery"}
    for path in CORE.glob("*.py"):
        for n in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else (
                [n.module or ""] if isinstance(n, ast.ImportFrom) else [])
            assert not any(x.split(".")[0] in banned for x in names), f"{path.name} imports {names}"


def test_unschedulable_is_a_decision_with_reasons_counted_per_filter():
    nodes = [node("a", gpu("a0", "h100-80gb"), gpu("a1", "h100-80gb"), gpu("a2", "h100-80gb")),
             node("b", gpu("b0", instances=[("7g.80gb", 0)]), gpu("b1", health="cordoned")),
             node("c", gpu("c0"), online=False)]
    d = Scheduler(Pool(nodes)).decide(Request(models=frozenset({"a100-80gb"}), memory_gb=10))
    assert not d.ok and d.placements == []
    assert d.reasons == {"wrong model": 3, "no legal placement": 1, "cordoned": 1, "node offline": 1}
    assert d.explain() == "6 GPUs: 3 wrong model, 1 cordoned, 1 no legal placement, 1 node offline"


def test_reasons_are_the_same_in_both_modes():
    nodes = uniform_nodes(3, cuda="12.2") + [node("x", gpu("x0", "l4", mig_on=False), region="eu-west"),
                                             node("y", gpu("y0", instances=[("7g.80gb", 0)]))]
    request = Request(min_cuda="12.4", memory_gb=30)
    fast, exhaustive = (Scheduler(Pool(nodes), mode=m).decide(request) for m in ("fast", "exhaustive"))
    assert not fast.ok and not exhaustive.ok
    assert fast.reasons == exhaustive.reasons == {
        "cuda 12.2 < required 12.4": 6, "needs 30 GB per GPU": 1, "no legal placement": 1}


def test_a_placed_decision_carries_a_breakdown_that_sums_to_its_score():
    d = Scheduler(Pool(uniform_nodes(2))).decide(Request(memory_gb=10, buyer_region="us-east"))
    assert d.ok and set(d.breakdown) == {"price", "latency", "packing", "reliability", "interruption"}
    assert sum(d.breakdown.values()) == pytest.approx(d.score) and 0 <= d.score <= 100
    assert d.explain().startswith("placed on ")


def test_cheaper_nodes_win_when_all_else_is_equal():
    nodes = [node("dear", gpu("d0"), price=3.0), node("cheap", gpu("c0"), price=1.0)]
    for mode in ("fast", "exhaustive"):
        d = Scheduler(Pool(nodes), mode=mode).decide(Request(memory_gb=10))
        assert d.placements[0].node_id == "cheap"


def test_closer_nodes_win_when_all_else_is_equal():
    nodes = [node("far", gpu("f0"), region="ap-southeast"), node("near", gpu("n0"), region="eu-west")]
    d = Scheduler(Pool(nodes)).decide(Request(memory_gb=10, buyer_region="eu-central"))
    assert d.placements[0].node_id == "near"


def test_spot_requests_prefer_nodes_that_interrupt_less():
    nodes = [node("flaky", gpu("f0"), interruption_rate=1.0), node("calm", gpu("c0"), interruption_rate=0.0)]
    d = Scheduler(Pool(nodes)).decide(Request(memory_gb=10, mode="spot"))
    assert d.placements[0].node_id == "calm"


def test_decide_does_not_change_the_pool():
    pool = Pool(uniform_nodes(2))
    before = [list(r.gpu.instances) for r in pool.records]
    Scheduler(pool).decide(Request(memory_gb=10))
    assert [list(r.gpu.instances) for r in pool.records] == before


def test_pool_copies_the_snapshot_it_is_given():
    nodes = uniform_nodes(1)
    pool = Pool(nodes)
    Scheduler(pool).place(Request(memory_gb=10, lease_id="L"))
    assert all(not g.instances for n in nodes for g in n.gpus)


def test_place_then_release_restores_capacity_and_indexes():
    pool = Pool(uniform_nodes(1, per_node=1))
    s = Scheduler(pool)
    full = [s.place(Request(memory_gb=70, lease_id=f"L{i}")) for i in range(2)]
    assert full[0].ok and not full[1].ok and pool.free_share() == 0.0
    assert pool.release(full[0].placements[0].gpu_uuid, "L0") == 1
    assert pool.free_share() == 1.0 and s.decide(Request(memory_gb=70)).ok


def test_allocating_a_stale_decision_is_refused_and_changes_nothing():
    pool = Pool(uniform_nodes(1, per_node=1))
    s = Scheduler(pool)
    d = s.decide(Request(memory_gb=70))
    s.place(Request(memory_gb=70, lease_id="first"))
    with pytest.raises(CapacityError):
        pool.allocate(d, Request(memory_gb=70, lease_id="second"))
    assert [i.lease_id for i in pool.gpu("n0-g0").instances] == ["first"]


def test_an_unschedulable_decision_cannot_be_allocated():
    with pytest.raises(CapacityError):
        Pool(uniform_nodes(1)).allocate(Decision(ok=False), Request())


def test_a_placement_on_an_unknown_gpu_is_refused():
    with pytest.raises(CapacityError):
        Pool(uniform_nodes(1)).allocate(Decision(ok=True, placements=[Placement("n0", "nope", None, 0)]), Request())


def test_cordoning_and_taking_a_node_offline_remove_capacity_from_the_indexes():
    pool = Pool(uniform_nodes(2, per_node=1))
    pool.set_gpu_health("n0-g0", "cordoned")
    pool.set_node("n1", online=False)
    for mode in ("fast", "exhaustive"):
        d = Scheduler(pool, mode=mode).decide(Request(memory_gb=10))
        assert not d.ok and d.reasons == {"cordoned": 1, "node offline": 1}
    pool.set_gpu_health("n0-g0", "healthy")
    assert Scheduler(pool).decide(Request(memory_gb=10)).placements[0].gpu_uuid == "n0-g0"


def test_changing_a_node_price_moves_it_in_the_fast_index():
    pool = Pool([node("a", gpu("a0"), price=1.0), node("b", gpu("b0"), price=2.0)])
    s = Scheduler(pool, max_candidates=1)
    assert s.decide(Request(memory_gb=10)).placements[0].node_id == "a"
    pool.set_node("a", price_per_gpu_hour=5.0)
    assert s.decide(Request(memory_gb=10)).placements[0].node_id == "b"


def test_free_share_counts_schedulable_capacity_per_model():
    pool = Pool([node("n", gpu("a", instances=[("4g.40gb", 0)]), gpu("b"), gpu("l", "l4", mig_on=False))])
    assert pool.free_share("a100-80gb") == pytest.approx((3 / 7 + 1) / 2)
    assert pool.free_share("l4") == 1.0


@pytest.mark.parametrize("bad,reason", [
    (Request(gpu_count=0), "gpu_count must be at least 1"),
    (Request(memory_gb=-1), "memory and compute must be >= 0"),
    (Request(mode="gold"), "unknown class 'gold'"),  # type: ignore[arg-type]
])
def test_malformed_requests_are_unschedulable_with_a_reason(bad, reason):
    d = Scheduler(Pool(uniform_nodes(1))).decide(bad)
    assert not d.ok and d.reasons == {reason: 2}


def test_explain_of_an_empty_pool_says_so():
    assert Scheduler(Pool([])).decide(Request()).explain() == "no GPUs in the pool"


def test_load_raises_the_packing_weight_the_scheduler_uses():
    pool = Pool(uniform_nodes(1, per_node=2))
    s = Scheduler(pool)
    light = s.weights()["packing"]
    s.place(Request(memory_gb=70, lease_id="a"))
    s.place(Request(memory_gb=40, lease_id="b"))
    assert s.weights()["packing"] > light


def test_explain_false_skips_counting_reasons_but_still_refuses():
    d = Scheduler(Pool(uniform_nodes(2))).decide(Request(models=frozenset({"l4"})), explain=False)
    assert not d.ok and d.reasons == {}
