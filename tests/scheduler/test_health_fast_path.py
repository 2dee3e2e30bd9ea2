"""The gateway's per-sample health check answers exactly what health_services.sample_violations says."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.gateway.consumer import AgentConsumer
from scheduler.services.health import Thresholds, sample_violations

THRESHOLDS = Thresholds(90.0, 0, frozenset({48, 79}), power_share=1.1, power_samples=3)


@settings(max_examples=500, deadline=None)
@given(temp=st.one_of(st.none(), st.floats(0, 120)), power=st.one_of(st.none(), st.floats(0, 1000)),
       dbe=st.one_of(st.none(), st.integers(0, 5)), previous_dbe=st.one_of(st.none(), st.integers(0, 5)),
       xid=st.lists(st.sampled_from([13, 31, 48, 79]), max_size=2), tdp=st.one_of(st.none(), st.just(700.0)),
       streak=st.integers(0, 4))
def test_the_gateway_health_check_matches_the_pure_rule(temp, power, dbe, previous_dbe, xid, tdp, streak):
    consumer = AgentConsumer()
    consumer.thresholds = THRESHOLDS
    consumer.tdp_w = {"g": tdp}
    consumer.power_streak = {"g": streak}
    consumer.last_dbe = {} if previous_dbe is None else {"g": previous_dbe}
    sample = {"uuid": "g", "temp_c": temp, "power_w": power, "ecc_dbe": dbe, "xid": xid}
    expected = sample_violations(sample, THRESHOLDS, previous_dbe=previous_dbe, tdp_w=tdp, samples_over_power=streak)
    assert consumer._health(sample) == expected
    if dbe is not None:
        assert consumer.last_dbe["g"] == dbe
