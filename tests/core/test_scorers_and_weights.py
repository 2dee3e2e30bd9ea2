"""Scorer plugins (raw value and 0..100 normalisation) and the load rule for weights, table-driven."""
from __future__ import annotations

import pytest

from scheduler.core import scorers as S
from scheduler.core.model import Request
from scheduler.core.placement import Option
from scheduler.core.weights import DEFAULT_WEIGHTS, Weights, packing_factor, price_factor, weights_for

from .pools import gpu, node


def option(*, price=1.0, pu=10.0, pack=0.0, region="us-east", reliability=0.99, rate=0.0, health="healthy"):
    n = node("n", gpu("g", health=health), region=region, reliability=reliability, interruption_rate=rate)
    return Option(n, n.gpus, None, 0, pack, price, pu)


@pytest.mark.parametrize("price,pu,expected", [(0.0, 10, 100.0), (3.0, 10, 50.0), (9.0, 10, 25.0)])
def test_price_score_is_higher_for_cheaper_performance(price, pu, expected):
    assert S.PriceScorer().score(option(price=price, pu=pu), Request()) == pytest.approx(expected)


@pytest.mark.parametrize("buyer,node_region,expected", [
    (None, "eu-west", 100.0), ("us-east", "us-east", 100 * (1 - 2 / 250)),
    ("us-east", "eu-west", 100 * (1 - 75 / 250)), ("ap-southeast", "sa-east", 0.0),
    ("us-east", "mars-1", 100 * (1 - 200 / 250)),
])
def test_latency_score_falls_with_round_trip_time(buyer, node_region, expected):
    assert S.LatencyScorer().score(option(region=node_region), Request(buyer_region=buyer)) == pytest.approx(expected)


@pytest.mark.parametrize("pack,expected", [(-0.6, 100.0), (-0.25, 75.0), (0.0, 50.0), (0.125, 37.5), (0.7, 0.0)])
def test_packing_score_prefers_the_smallest_fragmentation_increase(pack, expected):
    assert S.PackingScorer().score(option(pack=pack), Request()) == pytest.approx(expected)


@pytest.mark.parametrize("reliability,health,expected", [
    (1.0, "healthy", 100.0), (0.9, "healthy", 50.0), (0.7, "healthy", 0.0), (1.0, "degraded", 0.0),
])
def test_reliability_score_counts_history_and_health(reliability, health, expected):
    assert S.ReliabilityScorer().score(option(reliability=reliability, health=health), Request()) \
        == pytest.approx(expected)


@pytest.mark.parametrize("mode,rate,expected", [
    ("spot", 0.0, 100.0), ("spot", 0.2, 50.0), ("spot", 0.6, 25.0), ("on_demand", 5.0, 100.0),
])
def test_interruption_score_matters_only_for_spot(mode, rate, expected):
    assert S.InterruptionScorer().score(option(rate=rate), Request(mode=mode)) == pytest.approx(expected)


@pytest.mark.parametrize("scorer", S.DEFAULT_SCORERS, ids=lambda s: s.name)
@pytest.mark.parametrize("raw", [-1e9, -1.0, 0.0, 0.5, 1.0, 1e9, float("inf")])
def test_every_score_is_normalised_into_0_to_100(scorer, raw):
    assert 0.0 <= scorer.normalise(raw) <= 100.0


@pytest.mark.parametrize("free_share,expected", [(1.0, 1.0), (0.3, 1.0), (0.2, 1.25), (0.1, 1.5), (0.0, 1.5)])
def test_price_weight_rises_as_the_free_share_falls_under_20_percent(free_share, expected):
    assert price_factor(free_share=free_share) == pytest.approx(expected)


@pytest.mark.parametrize("load,expected", [(0.0, 1.0), (0.5, 1.0), (0.75, 1.5), (1.0, 2.0)])
def test_packing_weight_rises_with_load(load, expected):
    assert packing_factor(load=load) == pytest.approx(expected)


@pytest.mark.parametrize("load", [0.0, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0])
def test_weights_for_moves_only_price_and_packing(load):
    w = weights_for(DEFAULT_WEIGHTS, load=load)
    for name in ("latency", "reliability", "interruption"):
        assert w[name] == DEFAULT_WEIGHTS[name]
    assert w["price"] >= DEFAULT_WEIGHTS["price"] and w["packing"] >= DEFAULT_WEIGHTS["packing"]


def test_weights_for_is_continuous_in_load():
    steps = [weights_for(DEFAULT_WEIGHTS, load=i / 1000) for i in range(1001)]
    for a, b in zip(steps, steps[1:]):
        assert abs(a["price"] - b["price"]) < 0.01 and abs(a["packing"] - b["packing"]) < 0.01


def test_weights_refuse_negative_values_and_compare_as_mappings():
    with pytest.raises(ValueError):
        Weights(price=-1)
    assert Weights(price=1.0) == {"price": 1.0}
    assert Weights(price=1.0).get("latency") == 0.0
