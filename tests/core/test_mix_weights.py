"""Weights that adapt to the demand mix the engine learns (weights.mix_factor, DemandMix.shape_shares)."""
from __future__ import annotations

import pytest

from scheduler.core.engine import Pool, Scheduler
from scheduler.core.fragmentation import DemandMix
from scheduler.core.model import Request
from scheduler.core.weights import DEFAULT_WEIGHTS, mix_factor, weights_for

from .pools import uniform_nodes


@pytest.mark.parametrize("slices, multi, gain, expected", [
    (0.0, 0.0, 2.0, 1.0),   # only whole single GPUs: the base weights
    (0.5, 0.0, 2.0, 2.0),
    (0.4, 0.1, 2.0, 2.0),   # slices and gangs count alike
    (1.0, 0.0, 2.0, 3.0),
    (0.9, 0.3, 2.0, 3.0),   # exposure is capped at all requests
    (0.5, 0.0, 0.0, 1.0),   # no gain: no adaptation
    (-0.1, 0.0, 2.0, 1.0),  # nonsense shares are clamped
])
def test_packing_weighs_more_the_more_requests_depend_on_packing(slices, multi, gain, expected):
    assert mix_factor(slices=slices, multi=multi, gain=gain) == pytest.approx(expected)


@pytest.mark.parametrize("load", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("mix", [(0.0, 0.0), (0.45, 0.01), (0.6, 0.2)])
def test_the_mix_moves_only_the_packing_weight(load, mix):
    plain = weights_for(DEFAULT_WEIGHTS, load=load)
    moved = weights_for(DEFAULT_WEIGHTS, load=load, mix=mix, gain=2.0)
    assert moved["packing"] == pytest.approx(plain["packing"] * mix_factor(slices=mix[0], multi=mix[1], gain=2.0))
    for name in ("price", "latency", "reliability", "interruption"):
        assert moved[name] == plain[name]


def test_without_a_mix_the_weights_are_the_load_rule_alone():
    assert weights_for(DEFAULT_WEIGHTS, load=0.7, mix=None, gain=5.0) == weights_for(DEFAULT_WEIGHTS, load=0.7)


@pytest.mark.parametrize("requests, expected", [
    ([], (0.0, 0.0)),
    ([Request(memory_gb=10)] * 3 + [Request(whole_gpu=True)], (0.75, 0.0)),
    ([Request(whole_gpu=True, gpu_count=4), Request(whole_gpu=True)], (0.0, 0.5)),
    ([Request(memory_gb=10), Request(whole_gpu=True, gpu_count=2), Request(whole_gpu=True),
      Request(whole_gpu=True)], (0.25, 0.25)),
])
def test_the_mix_learns_the_shares_of_request_shapes_at_each_refresh(requests, expected):
    mix = DemandMix(refresh_every=1000)
    for r in requests:
        mix.observe(r)
    assert mix.shape_shares() == (0.0, 0.0)  # nothing moves between refreshes: caches stay valid
    mix.refresh()
    assert mix.shape_shares() == pytest.approx(expected)


def test_a_scheduler_with_a_mix_gain_weighs_packing_by_what_it_has_learnt():
    pool = Pool(uniform_nodes(2))
    adaptive, plain = Scheduler(pool, mix_gain=2.0), Scheduler(pool)
    before = adaptive.weights()
    assert before == plain.weights()
    for _ in range(4):
        pool.mix.observe(Request(memory_gb=10))
    pool.mix.refresh()
    assert adaptive.weights()["packing"] == pytest.approx(before["packing"] * 3.0)
    assert plain.weights() == before  # the default engine keeps the load rule alone
