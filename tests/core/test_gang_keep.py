"""The keep charge on MIG GPUs taken whole (placement.gang_keep, issue 12 §2 round five).

A single whole GPU taken from a free MIG GPU costs GANG_KEEP_PER_GPU × Σ_k P(k) × k of the model's demand for
k GPUs on one node, at most Σ_k P(k) + GANG_KEEP_MARGIN; slices no longer buy a keep charge (they fit beside
other slices on part-used GPUs, and an empty MIG GPU is itself fragmented for the slices that cannot cover all
of it), and a gang pays none. Measured on scheduler/sim/generalise.py's variants: docs/simulator.md, "Round five".
Since round eight the charge counts only gangs a node of the model can host (`Pool.gangs`), and an unpinned single
pays the share of the model's demand that is pinned to it (`placement.pin_keep`; docs/simulator.md, "Round eight").
"""
from __future__ import annotations

import pytest

from scheduler.core import fragmentation as FR
from scheduler.core import placement
from scheduler.core import pool as pool_mod
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
    keep = min(placement.GANG_KEEP_PER_GPU * 4 * multi[0][1],
               placement.NODE_TERM_WEIGHT * multi[0][1] + placement.GANG_KEEP_MARGIN)
    assert single == pytest.approx(empty + keep) and keep > 0.25
    d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode=mode).decide(Request(whole_gpu=True))
    assert d.ok and d.placements[0].node_id == "p"


def test_the_keep_charge_weighs_gangs_by_size_and_is_capped():
    assert placement.gang_keep(()) == 0.0
    assert placement.gang_keep(((2, 0.1),)) == pytest.approx(placement.GANG_KEEP_PER_GPU * 0.2)
    assert placement.gang_keep(((8, 0.05),)) == pytest.approx(4 * placement.gang_keep(((2, 0.05),)))
    # mostly 8-GPU demand: capped at what the node term gives back (NODE_TERM_WEIGHT × Σ P(k)) + the margin, so
    # a single taken from a node that can host no gang still scores inside the packing range
    # (tests/core/test_fgd_terms.py)
    assert placement.gang_keep(((8, 0.8),)) == pytest.approx(
        placement.NODE_TERM_WEIGHT * 0.8 + placement.GANG_KEEP_MARGIN)
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


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
def test_gangs_no_node_of_the_model_can_host_add_no_keep_charge(mode):
    # 8-GPU jobs could run on any MIG model, so the mix counts them on the A30s too; no A30 node has eight
    big = node("big", *[gpu(f"b{i}") for i in range(8)])  # first in pool order: a tie would go to it
    small = node("small", gpu("s0", "a30-24gb"), gpu("s1", "a30-24gb"))
    pool = Pool([big, small], mix=_mix((Request(gpu_count=8), 10), (Request(whole_gpu=True), 30)))
    assert pool.mix.multi_gpu("a30-24gb") and pool.gangs("a30-24gb") == ()
    assert pool.gangs("a100-80gb") == pool.mix.multi_gpu("a100-80gb")
    a30 = pool.gpu("s0")
    assert placement.whole_cost(pool, a30, Request(whole_gpu=True)) == pytest.approx(
        pool.frags.whole_delta("a30-24gb", a30.geometry))
    d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode=mode).decide(Request(whole_gpu=True))
    assert d.ok and d.placements[0].node_id == "small"


def _pinned_pool(taken: int = 4) -> Pool:
    # the A30 first in pool order, so a tie would go to it; a third of the demand can run only on A30s, and `taken`
    # of the five A30s are in use (4: the model is scarce, pool.pin_scarcity 0.75)
    a30 = node("a30", gpu("p0", "a30-24gb"), *[gpu(f"p{i}", "a30-24gb", instances=((None, 0),))
                                               for i in range(1, 1 + taken)],
               *[gpu(f"p{i}", "a30-24gb") for i in range(1 + taken, 5)])
    plain = node("l4", gpu("q0", "l4", mig_on=False))
    pinned = Request(whole_gpu=True, models=frozenset({"a30-24gb"}))
    return Pool([a30, plain], mix=_mix((pinned, 20), (Request(whole_gpu=True), 40)))


def test_an_unpinned_single_pays_for_the_demand_pinned_to_the_model_and_a_pinned_one_does_not():
    pool = _pinned_pool()
    share = pool.mix.pinned_share("a30-24gb")
    assert pool.mix.pinned_share("a100-80gb") == 0.0 and 0.2 < share < 1 / 3  # the prior is in the mix too
    a30, n = pool.gpu("p0"), pool.nodes["a30"]
    free = placement.whole_cost(pool, a30, Request(whole_gpu=True, models=frozenset({"a30-24gb"})))
    assert free == pytest.approx(pool.frags.whole_delta("a30-24gb", a30.geometry))
    unpinned = placement.single_option(pool, n, a30, Request(whole_gpu=True), node_term=False)
    pinned = placement.single_option(pool, n, a30, Request(whole_gpu=True, models=frozenset({"a30-24gb"})),
                                     node_term=False)  # the same GPU and shape, memoised apart
    scarce = pool.pin_scarcity("a30-24gb")
    assert scarce == pytest.approx((0.8 - pool_mod.PIN_SCARCE_FROM) / (1 - pool_mod.PIN_SCARCE_FROM))
    assert unpinned.pack_cost == pytest.approx(free + placement.PIN_KEEP_WEIGHT * share * scarce)
    assert pinned.pack_cost == pytest.approx(free)


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
def test_an_unpinned_single_may_take_a_pinned_model_while_most_of_it_is_free(mode):
    # one A30 of five in use: less than PIN_SCARCE_FROM of the model is taken, so no pin charge, and pool order
    # takes the A30 as best-fit's would (round eleven: at light load a lighter charge packed better)
    pool = _pinned_pool(taken=1)
    assert pool.pin_scarcity("a30-24gb") == 0.0
    d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode=mode).decide(Request(whole_gpu=True))
    assert d.ok and d.placements[0].node_id == "a30"


def test_the_scarcity_follows_the_models_gpus_in_steps_and_renews_the_costs_when_it_moves(monkeypatch):
    monkeypatch.setattr(pool_mod, "PIN_SCARCE_FROM", 0.0)
    monkeypatch.setattr(pool_mod, "PIN_SCARCE_STEP", 0.1)
    nodes = [node("a30", *[gpu(f"p{i}", "a30-24gb") for i in range(20)])]
    pool = Pool(nodes, mix=_mix((Request(whole_gpu=True, models=frozenset({"a30-24gb"})), 10)))
    assert pool.pin_scarcity("a30-24gb") == 0.0
    levels, versions = [], []
    for i in range(20):  # take the A30s one by one: 5% of the model each
        sched = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode="fast")
        d = sched.decide(Request(whole_gpu=True, models=frozenset({"a30-24gb"}), lease_id=f"l{i}"))
        pool.allocate(d, Request(whole_gpu=True, models=frozenset({"a30-24gb"}), lease_id=f"l{i}"))
        levels.append(pool.pin_scarcity("a30-24gb"))
        versions.append(pool.mix.version)
    # the level moves once the model's use is PIN_SCARCE_STEP (0.1: two GPUs here) away from it
    assert levels == pytest.approx([0, 0.1, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4, 0.5, 0.5, 0.6, 0.6, 0.7, 0.7, 0.8, 0.8,
                                    0.9, 0.9, 1.0])
    moved = [i for i in range(1, 20) if versions[i] != versions[i - 1]]
    assert moved == [i for i in range(1, 20) if levels[i] != levels[i - 1]]  # each move renews the costs
    # use sitting at a boundary (one GPU freed and taken again) does not move it
    v = pool.mix.version
    for _ in range(3):
        pool.release_lease("l17")
        d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode="fast").decide(
            Request(whole_gpu=True, models=frozenset({"a30-24gb"}), lease_id="l17"))
        pool.allocate(d, Request(whole_gpu=True, models=frozenset({"a30-24gb"}), lease_id="l17"))
    assert pool.mix.version == v  # 0.95 and back to 1.0: under a step from the level, so no renewal at all
    monkeypatch.setattr(pool_mod, "PIN_SCARCE_FROM", 1.0)
    assert Pool(nodes).pin_scarcity("a30-24gb") == 1.0  # the ramp off: the full charge always


@pytest.mark.parametrize("mode", ["fast", "exhaustive"])
def test_an_unpinned_single_leaves_the_gpus_pinned_demand_needs(monkeypatch, mode):
    def choice():
        d = Scheduler(_pinned_pool(), weights=PACK_ONLY, adapt_weights=False, mode=mode).decide(
            Request(whole_gpu=True))
        assert d.ok
        return d.placements[0].node_id

    assert choice() == "l4"
    monkeypatch.setattr(placement, "PIN_KEEP_WEIGHT", 0.0)
    assert choice() == "a30"  # without the charge the two cost the same and pool order takes the A30


def test_the_pinned_share_moves_only_when_the_mix_is_refreshed():
    mix = FR.DemandMix(refresh_every=1000)
    assert mix.pinned_share("a30-24gb") == 0.0
    mix.observe(Request(whole_gpu=True, models=frozenset({"a30-24gb"})))
    assert mix.pinned_share("a30-24gb") == 0.0  # cached values stay valid until the snapshot moves
    mix.refresh()
    assert mix.pinned_share("a30-24gb") > 0.0 and mix.pinned_share("l4") == 0.0


def test_the_fast_walk_keeps_pinned_and_unpinned_requests_of_one_shape_apart():
    # pinned to every model of the pool: the same GPUs and shape as an unpinned request, but no pin charge
    # (the walk stops at the first GPU that passes, so it must meet the lists in the order of their real cost)
    everywhere = frozenset({"a30-24gb", "l4"})
    for first, second in ((everywhere, None), (None, everywhere)):
        sched = Scheduler(_pinned_pool(), weights=PACK_ONLY, adapt_weights=False, mode="fast", max_candidates=1)
        got = [sched.decide(Request(whole_gpu=True, models=m)).placements[0].node_id for m in (first, second)]
        assert got == ["a30" if first else "l4", "a30" if second else "l4"]


def test_the_keep_factor_follows_the_gangs_observed_wait():
    mix = FR.DemandMix()
    assert mix.keep_factor == 1.0  # no wait observed: the full charge
    v = mix.version
    for _ in range(40):
        mix.gang_started(0.0)  # gangs that start at once ease the charge towards the floor, in steps
    assert FR.KEEP_FLOOR <= mix.keep_factor < 0.2 and mix.version > v
    eased, v = mix.keep_factor, mix.version
    mix.gang_started(FR.KEEP_WAIT_S + 600.0)  # one that waited brings half of it back at once
    assert mix.keep_factor == pytest.approx(eased + FR.KEEP_RISE * (1 - eased), abs=FR.KEEP_STEP)
    assert mix.version > v
    for _ in range(10):
        mix.gang_started(3600.0)
    assert mix.keep_factor > 0.99


def test_the_keep_charge_is_scaled_by_the_keep_factor_and_costs_follow_it_at_once():
    pool = _pool(_mix((Request(gpu_count=4), 10), (Request(whole_gpu=True), 30)))
    a100, single = pool.gpu("m0"), Request(whole_gpu=True)
    empty = pool.frags.whole_delta("a100-80gb", a100.geometry)
    keep = placement.gang_keep(pool.gangs("a100-80gb"))
    full = placement.single_option(pool, pool.nodes["m"], a100, single, node_term=False)
    assert full is not None and full.pack_cost == pytest.approx(empty + keep)
    d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False).decide(single)
    assert d.ok and d.placements[0].node_id == "p"  # the 4-GPU gangs keep the MIG node whole
    for _ in range(100):  # gangs that all found a node at once
        pool.mix.gang_started(0.0)
    assert pool.mix.keep_factor < FR.KEEP_FLOOR + FR.KEEP_STEP
    eased = placement.single_option(pool, pool.nodes["m"], a100, single, node_term=False)  # not the memoised cost
    assert eased is not None and eased.pack_cost == pytest.approx(empty + keep * pool.mix.keep_factor)
    for mode in ("fast", "exhaustive"):  # gangs start at once: the single may take the MIG GPU whole, as it ties
        d = Scheduler(pool, weights=PACK_ONLY, adapt_weights=False, mode=mode).decide(single)
        assert d.ok and d.placements[0].node_id == "m"
