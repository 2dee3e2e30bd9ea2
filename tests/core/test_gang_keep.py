"""The keep charge on MIG GPUs taken whole (placement.gang_keep, issue 12 §2 round five).

A single whole GPU taken from a free MIG GPU costs GANG_KEEP_PER_GPU × Σ_k P(k) × k of the model's demand for
k GPUs on one node, at most Σ_k P(k) + GANG_KEEP_MARGIN; slices no longer buy a keep charge (they fit beside
other slices on part-used GPUs, and an empty MIG GPU is itself fragmented for the slices that cannot cover all
of it), and a gang pays none. Measured on scheduler/sim/generalise.py's variants: docs/simulator.md, "Round five".
"""
from __future__ import annotations

import pytest

from scheduler.core import fragmentation as FR
from scheduler.core import placement
from scheduler.core.engine import Pool, Scheduler
from scheduler.core.model import Request
from scheduler.core.weights import Weights

from .pools import gpu, node

PACK_ONLY = Weights(packing=1.0)


def _mix(*requests: tuple[Request, int]) -> FR.DemandMix:
    mix = FR.DemandMix(refresh_every=1)
    for request, n in requests:
        for _ in range(n):
            mix.observe(request)
    return mix


def _pool(mix: FR.DemandMix) -> Pool:
    # pool order: the MIG node first, so a tie would go to it
    mig_node = node("m", *[gpu(f"m{i}") for i in range(8)])
    plain = node("p", gpu("p0", "l4", mig_on=False))
    return Pool([mig_node, plain], mix=mix)


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
def test_slice_demand_alone_does_not_keep_mig_gpus_from_whole_requests(mode):
    pool = _pool(_mix((Request(memory_gb=10), 40), (Request(whole_gpu=True), 10)))
    a100 = pool.gpu("m0")
    cost = placement.whole_cost(pool, a100, Request(whole_gpu=True))
    assert cost <= 0.0  # taking it whole only removes the empty GPU's own fragmentation (the old rule: +0.4)
    d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode=mode).decide(Request(whole_gpu=True))
    assert d.ok and d.placements[0].node_id == "m"


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
def test_gang_demand_sends_single_whole_requests_to_non_mig_gpus(mode):
    pool = _pool(_mix((Request(gpu_count=4), 10), (Request(whole_gpu=True), 30)))
    multi = pool.mix.multi_gpu("a100-80gb")
    assert multi and multi[0][0] == 4
    empty = pool.frags.whole_delta("a100-80gb", pool.gpu("m0").geometry)
    single = placement.whole_cost(pool, pool.gpu("m0"), Request(whole_gpu=True))
    assert single == pytest.approx(empty + placement.GANG_KEEP_PER_GPU * 4 * multi[0][1])
    d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode=mode).decide(Request(whole_gpu=True))
    assert d.ok and d.placements[0].node_id == "p"


def test_the_keep_charge_weighs_gangs_by_size_and_is_capped():
    assert placement.gang_keep(()) == 0.0
    assert placement.gang_keep(((2, 0.1),)) == pytest.approx(placement.GANG_KEEP_PER_GPU * 0.2)
    assert placement.gang_keep(((8, 0.1),)) == pytest.approx(4 * placement.gang_keep(((2, 0.1),)))
    # mostly 8-GPU demand: capped at Σ P(k) + the margin, so a single taken from a node that can host no gang
    # (node term − Σ P(k)) still scores inside the packing range (tests/core/test_fgd_terms.py)
    assert placement.gang_keep(((8, 0.8),)) == pytest.approx(0.8 + placement.GANG_KEEP_MARGIN)
    assert placement.GANG_KEEP_MARGIN < 0.5


def test_a_gang_pays_no_keep_charge_even_after_a_single_was_costed_on_the_same_layout():
    pool = _pool(_mix((Request(gpu_count=4), 10), (Request(whole_gpu=True), 30)))
    a100, m = pool.gpu("m0"), pool.nodes["m"]
    single = placement.single_option(pool, m, a100, Request(whole_gpu=True), node_term=False)
    gang = placement.single_option(pool, m, a100, Request(gpu_count=4), node_term=False)  # memoised apart
    assert single is not None and gang is not None
    assert gang.pack_cost == pytest.approx(pool.frags.whole_delta("a100-80gb", a100.geometry))
    assert single.pack_cost > gang.pack_cost + 0.1
    d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False).decide(Request(gpu_count=4))
    assert d.ok and {p.node_id for p in d.placements} == {"m"}
