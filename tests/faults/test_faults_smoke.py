"""The fault suite's stack comes up and its invariants hold before any fault."""
import pytest

from tests.faults.conftest import wait_idle
from tests.faults.invariants import assert_invariants

pytestmark = pytest.mark.e2e


def test_the_stack_starts_with_every_agent_online_and_the_invariants_hold(cluster, buyer):
    status, body = cluster.api("POST", "/api/v1/orders/", {"mode": "on_demand", "gpu_models": ["l4"],
                                                            "whole_gpu": True, "duration_seconds": 600},
                               key=buyer["api_key"])
    assert status in (201, 202), body
    assert_invariants(cluster)
    (lease,) = body["leases"]
    status, ended = cluster.api("POST", f"/api/v1/leases/{lease}/end/", {}, key=buyer["api_key"])
    assert status == 200, ended
    wait_idle(cluster)  # what it ordered is gone: the next test starts from an idle stack
