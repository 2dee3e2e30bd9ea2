"""The metrics validator's fast path accepts nothing that the explaining checks would refuse."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent import protocol

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3), st.lists(st.integers(), max_size=2))
KEYS = ["util", "mem_used_mib", "mem_total_mib", "temp_c", "power_w", "sm_clock_mhz", "ecc_sbe", "ecc_dbe"]


@st.composite
def samples(draw):
    g = {"uuid": draw(st.one_of(st.just("GPU-1"), VALUES))}
    for key in KEYS:
        if draw(st.booleans()):
            g[key] = draw(VALUES)
    if draw(st.booleans()):
        g["xid"] = draw(st.one_of(VALUES, st.lists(st.one_of(st.integers(), st.booleans(), st.floats()),
                                                     max_size=3)))
    return g


@settings(max_examples=400, deadline=None)
@given(sample=samples())
def test_the_fast_path_accepts_only_what_the_full_checks_accept(sample):
    frame = {"v": 1, "type": "metrics", "ts": 1.0, "gpus": [sample]}
    if protocol._sample_ok(sample):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(protocol, "_sample_ok", lambda g: False)
            protocol.validate_metrics(frame)  # must not raise


@pytest.mark.parametrize("reading", [{"util": float("nan")}, {"mem_used_mib": float("inf")}, {"util": True},
                                     {"temp_c": 500}, {"ecc_dbe": 2**64}, {"xid": [True]}, {"uuid": 7}])
def test_odd_readings_fall_to_the_explaining_checks_and_are_refused(reading):
    sample = {"uuid": "GPU-1", "util": 5.0, **reading}
    assert not protocol._sample_ok(sample)
    with pytest.raises(protocol.ProtocolError):
        protocol.validate_metrics({"v": 1, "type": "metrics", "ts": 1.0, "gpus": [sample]})
