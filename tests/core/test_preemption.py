"""Preemption planning: cheapest set of spot leases, never a reserved or on-demand one, never for spot."""
from __future__ import annotations

import pytest

from scheduler.core.engine import Pool, Scheduler
from scheduler.core.model import Request

from .pools import gpu, node


def full_gpu(uuid, *layout):
    """layout: (profile, start, lease, class, value) tuples."""
    return gpu(uuid, instances=list(layout))


def plan(nodes, request, **kw):
    return Scheduler(Pool(nodes), **kw).decide(request)


@pytest.mark.parametrize("mode,expect_preempt", [("on_demand", True), ("reserved", True), ("spot", False)])
def test_only_higher_classes_preempt_spot(mode, expect_preempt):
    g = full_gpu("g", ("7g.80gb", 0, "s1", "spot", 5.0))
    d = plan([node("n", g)], Request(memory_gb=10, mode=mode))
    assert d.ok is expect_preempt
    assert d.preempt == (["s1"] if expect_preempt else [])


def test_reserved_and_on_demand_instances_are_never_preempted():
    g = full_gpu("g", ("4g.40gb", 0, "od", "on_demand", 0.1), ("3g.40gb", 4, "rs", "reserved", 0.1))
    d = plan([node("n", g)], Request(memory_gb=10, mode="reserved"))
    assert not d.ok and d.preempt == [] and d.reasons == {"no legal placement": 1}


@pytest.mark.parametrize("value_at_0,value_at_4,expected", [(1.0, 9.0, "at0"), (9.0, 1.0, "at4")])
def test_the_spot_lease_with_least_remaining_value_goes(value_at_0, value_at_4, expected):
    g = full_gpu("g", ("3g.40gb", 0, "at0", "spot", value_at_0), ("3g.40gb", 4, "at4", "spot", value_at_4))
    d = plan([node("n", g)], Request(memory_gb=30))
    assert d.ok and d.preempt == [expected]


def test_fewer_leases_win_when_values_tie():
    # a 3g at 4 can come from removing the one 3g lease (value 2) or two 1g.20gb leases (1 + 1)
    g1 = full_gpu("a", ("4g.40gb", 0, "od", "on_demand", 1.0), ("3g.40gb", 4, "big", "spot", 2.0))
    g2 = full_gpu("b", ("4g.40gb", 0, "od2", "on_demand", 1.0), ("1g.20gb", 4, "s1", "spot", 1.0),
                  ("1g.20gb", 6, "s2", "spot", 1.0))
    d = plan([node("n", g1, g2)], Request(memory_gb=30))
    assert d.ok and d.preempt == ["big"]


def test_the_cheapest_set_spans_only_the_slices_in_the_way():
    g = full_gpu("g", ("1g.10gb", 0, "a", "spot", 5.0), ("1g.10gb", 1, "b", "spot", 5.0),
                 ("1g.10gb", 2, "c", "spot", 5.0), ("1g.10gb", 3, "d", "spot", 5.0),
                 ("3g.40gb", 4, "e", "spot", 12.0))
    d = plan([node("n", g)], Request(memory_gb=30))
    assert d.ok and d.preempt == ["e"] and d.placements[0].start == 4


def test_a_cordoned_gpu_is_not_freed_by_preemption():
    g = gpu("g", instances=[("7g.80gb", 0, "s", "spot", 1.0)], health="cordoned")
    d = plan([node("n", g)], Request(memory_gb=10))
    assert not d.ok and d.reasons == {"cordoned": 1}


def test_preemption_can_be_turned_off():
    g = full_gpu("g", ("7g.80gb", 0, "s", "spot", 1.0))
    assert not Scheduler(Pool([node("n", g)])).decide(Request(memory_gb=10), allow_preemption=False).ok


def test_k_gpus_preempt_whole_spot_gpus_on_one_node_cheapest_first():
    n = node("n", gpu("free"), full_gpu("s1", ("7g.80gb", 0, "x", "spot", 3.0)),
             full_gpu("s2", ("7g.80gb", 0, "y", "spot", 1.0)),
             full_gpu("od", ("1g.10gb", 0, "z", "on_demand", 0.0)))
    d = plan([n], Request(gpu_count=2))
    assert d.ok and d.preempt == ["y"] and sorted(p.gpu_uuid for p in d.placements) == ["free", "s2"]


def test_allocating_a_preempting_decision_removes_the_spot_lease_and_places():
    pool = Pool([node("n", full_gpu("g", ("4g.40gb", 0, "od", "on_demand", 1.0), ("3g.40gb", 4, "sp", "spot", 1.0)))])
    s = Scheduler(pool)
    d = s.place(Request(memory_gb=30, lease_id="new"))
    assert d.ok and d.preempt == ["sp"]
    assert sorted(i.lease_id for i in pool.gpu("g").instances) == ["new", "od"]
    assert pool.lease_gpus("sp") == []
