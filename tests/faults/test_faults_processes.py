"""Process faults (issue 10): agents killed with -9 at the worst moment, then started again.

Each fault is put at a known point, not left to timing: the simulated machine carves slowly (`--create-seconds`) so
the agent dies between carving and answering. Every test puts back what it killed, waits for every agent online,
ends what it placed, and ends with the invariants."""
from __future__ import annotations

import json

import pytest

from tests.e2e.livestack import wait_until
from tests.faults.conftest import wait_for_online
from tests.faults.invariants import assert_invariants

pytestmark = pytest.mark.e2e


# --- helpers ----------------------------------------------------------------------------------------------------

def order(cluster, buyer, body: dict) -> dict:
    status, placed = cluster.api("POST", "/api/v1/orders/", {"mode": "on_demand", "duration_seconds": 900, **body},
                                 key=buyer["api_key"])
    assert status in (201, 202), placed
    return placed


def lease(cluster, buyer, lease_id: str) -> dict:
    return cluster.api("GET", f"/api/v1/leases/{lease_id}/", key=buyer["api_key"])[1]


def running(cluster, buyer, lease_id: str, timeout: float = 20) -> dict:
    def state():
        got = lease(cluster, buyer, lease_id)
        assert got["state"] in ("provisioning", "running"), got
        return got if got["state"] == "running" else None
    return wait_until(state, timeout=timeout, what=f"lease {lease_id} running")


def end(cluster, buyer, *lease_ids: str) -> None:
    for lease_id in lease_ids:
        status, body = cluster.api("POST", f"/api/v1/leases/{lease_id}/end/", key=buyer["api_key"])
        assert status in (200, 202), body
    for lease_id in lease_ids:
        wait_until(lambda: lease(cluster, buyer, lease_id)["state"] == "ended", timeout=20,
                   what=f"lease {lease_id} ended")


def agent_instances(cluster, node: str) -> set[str]:
    """The MIG instances node's simulated machine holds (its state file: what the GPUs really have)."""
    path = cluster.agent_state(node)
    kept = json.loads(path.read_text()).get("instances", {}) if path.exists() else {}
    return {i["uuid"] for instances in kept.values() for i in instances}


def server_instances(cluster, node: str) -> set[str]:
    """The instances the server's live slices on `node` hold."""
    return set(cluster.shell(
        "import json; from scheduler.models import Slice; print('SLICES' + json.dumps(list(Slice.objects.filter("
        f"gpu__node__name={node!r}, state__in=Slice.ACTIVE_STATES).exclude(instance_uuid='')"
        ".values_list('instance_uuid', flat=True))))", "SLICES"))


def accrued_until(cluster, lease_id: str) -> str:
    """Up to when the lease's running seconds are metered (ISO time, in the database)."""
    return cluster.shell("from marketplace.models import Lease; "
                         f"print('UNTIL\"' + Lease.objects.get(pk={lease_id!r}).accrued_until.isoformat() + '\"')",
                         "UNTIL")


def restart_agent(cluster, node: str, *extra: str) -> None:
    """Start node's agent again as first started, plus `extra` flags (none: as it was)."""
    name = f"agent-{node}"
    program, argv, env = cluster.spawned[name]
    first = cluster.__dict__.setdefault("_first_argv", {}).setdefault(name, list(argv))
    cluster.spawned[name] = (program, [*first, *extra], env)
    cluster.restart(name)


# --- agents -----------------------------------------------------------------------------------------------------

def test_an_agent_killed_between_carving_and_answering_runs_the_lease_on_that_one_instance(cluster, buyer):
    node = "f-h100-a"
    restart_agent(cluster, node, "--create-seconds", "5")  # carving takes 5 s; the instance exists from the start
    wait_for_online(cluster)
    before = agent_instances(cluster, node)
    placed = order(cluster, buyer, {"gpu_models": ["h100-80gb"], "memory_gb": 20})
    lease_id = placed["leases"][0]
    wait_until(lambda: agent_instances(cluster, node) - before, timeout=15, what="the agent to carve the instance")
    cluster.kill(f"agent-{node}")  # kill -9 inside the 5 s: the answer is never sent
    assert lease(cluster, buyer, lease_id)["state"] == "provisioning"
    (carved,) = agent_instances(cluster, node) - before
    restart_agent(cluster, node)  # as it was, carving at once
    wait_for_online(cluster)
    ran = running(cluster, buyer, lease_id)
    assert ran["connection"]["device_uuid"] == carved  # the instance carved before the kill, not a second one
    assert agent_instances(cluster, node) == server_instances(cluster, node) == before | {carved}
    end(cluster, buyer, lease_id)
    wait_until(lambda: agent_instances(cluster, node) == before, timeout=15, what="the instance destroyed")
    assert_invariants(cluster)


def test_an_agent_killed_while_its_lease_runs_keeps_the_lease_running_and_billed(cluster, buyer):
    node = "f-a100-b"
    lease_id = order(cluster, buyer, {"gpu_models": ["a100-80gb"], "memory_gb": 20})["leases"][0]
    first = running(cluster, buyer, lease_id)
    instance = first["connection"]["device_uuid"]
    assert instance in agent_instances(cluster, node)
    cluster.kill(f"agent-{node}")
    restart_agent(cluster, node)
    wait_for_online(cluster)
    # The agent's hello reported the instance: the lease keeps running on it, billed on through the restart.
    metered = accrued_until(cluster, lease_id)
    wait_until(lambda: accrued_until(cluster, lease_id) > metered, timeout=30, what="metering to go on")
    after = lease(cluster, buyer, lease_id)
    assert (after["state"], after["connection"]["device_uuid"]) == ("running", instance)
    assert agent_instances(cluster, node) == server_instances(cluster, node) and instance in server_instances(
        cluster, node)
    assert_invariants(cluster)  # billed exactly its running seconds, the kill included
    end(cluster, buyer, lease_id)
    wait_until(lambda: instance not in agent_instances(cluster, node), timeout=15, what="the instance destroyed")
    assert_invariants(cluster)
