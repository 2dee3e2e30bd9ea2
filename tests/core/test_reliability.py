"""The reliability score you can take apart (scheduler/core/reliability.py) and its use by the scheduler."""
from __future__ import annotations

import pytest

from scheduler.core import reliability as R
from scheduler.core import scorers as S
from scheduler.core.engine import Scheduler
from scheduler.core.model import Request
from scheduler.core.placement import Option
from scheduler.core.pool import Pool
from scheduler.core.weights import DEFAULT_WEIGHTS

from .pools import gpu, node

DAY = 86400.0


def clean(**kw) -> R.Evidence:
    base = dict(window_seconds=30 * DAY, online_seconds=30 * DAY, commands_succeeded=40, leases_hosted=20)
    return R.Evidence(**{**base, **kw})


def component(s: R.Score, name: str) -> R.Component:
    return next(c for c in s.components if c.name == name)


def test_a_node_where_nothing_went_wrong_scores_one_and_weights_sum_to_one():
    s = R.score(clean())
    assert s.score == 1.0
    assert sum(c.weight for c in s.components) == pytest.approx(1.0)
    assert [c.name for c in s.components] == list(R.COMPONENTS)


def test_a_node_with_xids_scores_lower_and_its_health_component_names_the_codes():
    quiet, noisy = R.score(clean()), R.score(clean(health={"xid:79": 2, "xid:48": 1}))
    assert noisy.score < quiet.score
    health = component(noisy, "health")
    assert health.value == pytest.approx(1 / (1 + 2 * 0.5 + 0.3))
    assert health.events["xid:79"] == 2 and health.events["penalty"] == pytest.approx(1.3)
    assert noisy.score == pytest.approx(1 - 0.25 * (1 - health.value), abs=1e-4)


def test_an_xid_the_buyers_program_raises_costs_nothing():
    assert R.score(clean(health={"xid:13": 5, "xid:31": 3})).score == 1.0
    assert R.score(clean(health={"xid:999": 1})).score < 1.0  # an unknown code costs the default XID penalty


@pytest.mark.parametrize("evidence,name,expected", [
    (clean(online_seconds=27 * DAY), "uptime", 0.9),
    (clean(window_seconds=0, online_seconds=0), "uptime", 1.0),
    (clean(commands_succeeded=45, commands_failed=5), "provisioning", 0.9),
    (clean(commands_succeeded=0), "provisioning", 1.0),
    (clean(health={"thermal": 1, "power": 1, "ecc": 1}), "health", 1 / 1.3),
    (clean(interruptions_caused=5), "interruptions", 0.75),
    (clean(leases_hosted=0), "interruptions", 1.0),
    (clean(buyer_reports=2), "buyer_reports", 0.9),
    (clean(buyer_reports=30), "buyer_reports", 0.0),
])
def test_each_component_comes_from_its_events(evidence, name, expected):
    assert component(R.score(evidence), name).value == pytest.approx(expected)


def test_weights_are_data_and_the_formula_shows_each_term():
    only_uptime = R.Config(weights={"uptime": 1.0})
    s = R.score(clean(online_seconds=15 * DAY, health={"xid:79": 10}), only_uptime)
    assert s.score == pytest.approx(0.5)
    assert "1.00 × 0.500 (uptime)" in s.formula and s.formula.endswith("= 0.500")
    d = s.to_dict()
    assert d["components"][0]["events"] == {"online_seconds": 15 * 86400, "window_seconds": 30 * 86400}


@pytest.mark.parametrize("bad", [{"speed": 1.0}, {"uptime": -1.0}, {"uptime": 0.0}])
def test_malformed_weights_are_refused(bad):
    with pytest.raises(ValueError):
        R.Config(weights=bad)


def test_the_scorer_reads_the_least_reliable_gpus_own_score_before_its_nodes():
    n = node("n", gpu("a"), gpu("b"), reliability=1.0)
    n.gpus[1].reliability = 0.9
    both = Option(n, n.gpus, None, 0, 0.0, 1.0, 10.0)
    first = Option(n, n.gpus[:1], None, 0, 0.0, 1.0, 10.0)
    assert S.ReliabilityScorer().score(both, Request()) == pytest.approx(50.0)
    assert S.ReliabilityScorer().score(first, Request()) == pytest.approx(100.0)


def test_the_reliability_term_moves_a_placement_away_from_a_gpu_with_xids():
    """Two nodes alike but for price: the cheaper one's GPU threw XID 79 twice. Without the reliability term the
    scheduler takes the cheaper GPU; with it, the other."""
    xid_gpu = R.score(clean(health={"xid:79": 2})).score

    def pool():
        cheap = node("cheap", gpu("cheap-g0"), price=1.9, reliability=1.0)
        cheap.gpus[0].reliability = xid_gpu
        steady = node("steady", gpu("steady-g0"), price=2.0, reliability=1.0)
        steady.gpus[0].reliability = R.score(clean()).score
        return Pool([cheap, steady])

    request = Request(models=frozenset({"a100-80gb"}), whole_gpu=True)
    without = Scheduler(pool(), weights=DEFAULT_WEIGHTS.scaled(reliability=0.0), adapt_weights=False)
    with_term = Scheduler(pool(), adapt_weights=False)
    assert without.decide(request).placements[0].gpu_uuid == "cheap-g0"
    decision = with_term.decide(request)
    assert decision.placements[0].gpu_uuid == "steady-g0"
    assert decision.breakdown["reliability"] > 0
