"""FGD's two node/model-level cases (Weng et al., ATC'23), as the engine's fragmentation measure keeps them.

1. A request that cannot run on a model at all sees every free slice of that model's GPUs as fragment
   (the paper's simulator: `GetNodePodFrag` -> NoAccess / LackGpu -> "all idle GPU resources").
2. A request for k GPUs on one node cannot run on a node with fewer than k free GPUs, and those free GPUs are
   fragment to it (`node_delta`).
Why they matter (docs/performance.md, "Placement quality"): without 1, slices that fit a small card were cut
out of the large cards instead; without 2, single GPUs were taken from empty nodes that 8-GPU jobs need.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import fragmentation as FR
from nodeagent.hardware import mig
from scheduler.core.engine import Pool, Scheduler
from scheduler.core.model import Request
from scheduler.core.weights import Weights

from .pools import gpu, node

PACK_ONLY = Weights(packing=1.0)


def dist(**probs):
    return tuple(sorted(probs.items()))


@pytest.mark.parametrize("placed,distribution,expected", [
    ([], {"-": 1.0}, 1.0),  # nobody in the mix can run here: the whole free GPU is fragment
    ([("3g.40gb", 0)], {"-": 1.0}, 4 / 8),  # only free slices count, used ones are not fragment
    ([("3g.40gb", 0)], {"-": 0.5, "3g.40gb": 0.5}, 0.5 * 4 / 8),  # 3g still fits at 4
    ([("3g.40gb", 0)], {"-": 0.5, "7g.80gb": 0.5}, 4 / 8),  # both halves of the mix strand slices 4-7
    ([("4g.40gb", 0), ("3g.40gb", 4)], {"-": 1.0}, 0.0),  # nothing free, nothing fragmented
])
def test_no_access_mass_counts_every_free_slice(placed, distribution, expected):
    insts = [mig.Instance(p, s) for p, s in placed]
    assert FR.frag(mig.A100_80GB, insts, dist(**distribution)) == pytest.approx(expected)


@pytest.mark.parametrize("request_kw,on_a30", [
    (dict(memory_gb=40), "-"),  # 40 GB fits no A30 profile: cannot run there
    (dict(memory_gb=10, models=frozenset({"a100-80gb"})), "-"),  # the buyer left A30s out
    (dict(memory_gb=10), "2g.12gb"),
    (dict(whole_gpu=True), "4g.24gb"),
])
def test_demand_mix_keeps_requests_that_cannot_run_on_a_model_as_no_access(request_kw, on_a30):
    mix = FR.DemandMix(refresh_every=1, no_access=True)  # off by default since issue 12 §2 round two
    for _ in range(1000):
        mix.observe(Request(**request_kw))
    share = dict(mix.distribution("a30-24gb"))
    assert max(share, key=share.get) == on_a30
    assert mix.no_access_share("a30-24gb") == pytest.approx(share.get("-", 0.0))


def test_no_access_can_be_switched_off_to_get_the_fit_only_mix():
    mix = FR.DemandMix(refresh_every=1, no_access=False)
    for _ in range(100):
        mix.observe(Request(memory_gb=40))
    assert "-" not in dict(mix.distribution("a30-24gb")) and mix.no_access_share("a30-24gb") == 0.0


@pytest.mark.parametrize("multi,free_before,taken,expected", [
    ((), 8, 1, 0.0),  # no multi-GPU demand: no node term
    (((8, 0.1),), 8, 1, 0.1 * 7),  # breaking the last whole 8 strands 7 GPUs for 8-GPU requests
    (((8, 0.1),), 3, 1, -0.1),  # a node that could not host 8 anyway: one fewer stranded GPU
    (((8, 0.1),), 8, 8, 0.0),  # an 8-GPU job on an empty 8-GPU node leaves nothing behind
    (((2, 0.2),), 8, 1, 0.0),  # 7 free still hosts a 2-GPU request
    (((2, 0.2),), 2, 1, 0.2),  # 1 free GPU cannot host 2
    (((2, 0.2), (8, 0.1)), 8, 1, 0.7),
    (((4, 0.1),), 5, 2, 0.3),  # 5 -> 3 free: 3 stranded for 4-GPU requests
])
def test_node_delta_table(multi, free_before, taken, expected):
    assert FR.node_delta(multi, free_before, taken) == pytest.approx(expected)


@given(multi=st.lists(st.tuples(st.integers(2, 8), st.floats(0, 1)), max_size=4),
       free=st.integers(0, 8), taken=st.integers(0, 8))
@settings(max_examples=200, deadline=None)
def test_node_delta_is_the_difference_of_the_node_terms(multi, free, taken):
    taken = min(taken, free)

    def term(f):
        return sum(p * (f if f < k else 0) for k, p in multi)
    assert FR.node_delta(multi, free, taken) == pytest.approx(term(free - taken) - term(free) if taken else 0.0)


def _mix_with_eight_gpu_demand():
    mix = FR.DemandMix(refresh_every=1)
    for _ in range(20):
        mix.observe(Request(gpu_count=8))
    for _ in range(20):
        mix.observe(Request(whole_gpu=True))
    return mix


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
def test_a_single_gpu_keeps_empty_nodes_free_for_eight_gpu_requests(mode):
    # node "a" comes first in pool order and is empty; "b" already has 2 of its 8 GPUs busy, so it cannot host
    # an 8-GPU job. FGD takes the single GPU from "b" (before the node term it went to "a", by pool order).
    a = node("a", *[gpu(f"a{i}") for i in range(8)])
    b = node("b", *[gpu(f"b{i}", instances=[(None, 0)] if i < 2 else ()) for i in range(8)])
    pool = Pool([a, b], mix=_mix_with_eight_gpu_demand())
    for want in (Request(whole_gpu=True), Request(memory_gb=70)):
        d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode=mode).decide(want)
        assert d.ok and d.placements[0].node_id == "b", want


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
def test_node_term_off_restores_pool_order(mode):
    a = node("a", *[gpu(f"a{i}") for i in range(8)])
    b = node("b", *[gpu(f"b{i}", instances=[(None, 0)] if i < 2 else ()) for i in range(8)])
    pool = Pool([a, b], mix=_mix_with_eight_gpu_demand())
    pool.node_term = False
    d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode=mode).decide(Request(whole_gpu=True))
    assert d.placements[0].node_id == "a"


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
def test_a_small_slice_uses_a_card_most_demand_cannot_use_rather_than_cut_a_large_one(mode):
    # Most demand wants 3g.40gb or 7g.80gb slices, which no A30 can hold. A 15 GB slice on a fresh A100-80GB
    # would strand slices those requests need; on the A30 it takes memory almost nobody else could use.
    mix = FR.DemandMix(refresh_every=1)
    for _ in range(60):
        mix.observe(Request(memory_gb=70))
    for _ in range(30):
        mix.observe(Request(memory_gb=35))
    for _ in range(10):
        mix.observe(Request(memory_gb=15))
    pool = Pool([node("big", gpu("a100")), node("small", gpu("a30", "a30-24gb"))], mix=mix)
    d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode=mode).decide(Request(memory_gb=15))
    assert d.placements[0].gpu_uuid == "a30" and d.placements[0].profile == "4g.24gb"


def test_waste_on_a_mig_gpu_counts_only_for_the_demand_that_could_run_there():
    from scheduler.core.placement import WASTE_WEIGHT, single_option
    mix = FR.DemandMix(refresh_every=1)
    for _ in range(100):
        mix.observe(Request(memory_gb=70))  # cannot run on an A30
    pool = Pool([node("small", gpu("a30", "a30-24gb"))], mix=mix)
    rec = pool.record("a30")
    opt = single_option(pool, rec.node, rec.gpu, Request(memory_gb=13), idx=0)  # 4g.24gb: the whole A30
    na = mix.no_access_share("a30-24gb")
    delta = -FR.frag(rec.gpu.geometry, [], mix.distribution("a30-24gb"))
    assert opt.pack_cost == pytest.approx(delta + WASTE_WEIGHT * (24 - 13) / 24 * (1 - na))


@pytest.mark.parametrize("weight", [1.0, 0.25])
def test_the_node_term_enters_the_packing_cost_with_its_weight(monkeypatch, weight):
    from scheduler.core import placement
    monkeypatch.setattr(placement, "NODE_TERM_WEIGHT", weight)
    costs = []
    for with_node_term in (True, False):
        pool = Pool([node("a", *[gpu(f"a{i}") for i in range(8)])], mix=_mix_with_eight_gpu_demand())
        pool.node_term = with_node_term
        opt = placement.single_option(pool, pool.nodes["a"], pool.gpu("a0"), Request(whole_gpu=True))
        costs.append(opt.pack_cost)
    multi = _mix_with_eight_gpu_demand().multi_gpu("a100-80gb")
    assert costs[0] - costs[1] == pytest.approx(weight * FR.node_delta(multi, 8, 1))
    assert FR.node_delta(multi, 8, 1) == pytest.approx(7 * multi[0][1])  # the last node able to host an 8-GPU job
