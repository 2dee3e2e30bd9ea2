"""Process faults (issue 10): agents and workers killed with -9 at the worst moment, then started again.

Each fault is put at a known point, not left to timing: the simulated machine carves slowly (`--create-seconds`) so
the agent dies between carving and answering; a row lock held by the test on the cluster's own PostgreSQL holds a
worker inside its metering or placement transaction (seen in pg_stat_activity) when it is killed. Every test puts
back what it killed, waits for every agent online, ends what it placed, and ends with the invariants."""
from __future__ import annotations

import contextlib
import json

import psycopg
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


@contextlib.contextmanager
def row_locked(cluster, sql: str, params: tuple):
    """Hold FOR UPDATE locks on the rows `sql` selects (in the cluster's database) until the block ends."""
    with psycopg.connect(cluster.env["DATABASE_URL"], connect_timeout=10) as conn:
        rows = conn.execute(sql + " FOR UPDATE", params).fetchall()
        assert rows, f"nothing to lock: {sql} {params}"
        yield conn
        conn.rollback()


def waiting_on(conn, table: str, timeout: float = 90) -> None:
    """Until another session of the database waits for a lock while running a statement on `table`."""
    def blocked():
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND wait_event_type = 'Lock' AND query ILIKE %s", (f"%{table}%",)).fetchone()[0]
    wait_until(blocked, timeout=timeout, interval=0.2, what=f"a worker blocked on a lock of {table}")


def restart_workers(cluster) -> None:
    for i in range(cluster.workers):
        cluster.restart(f"worker{i}")


def kill_workers(cluster) -> None:
    for i in range(cluster.workers):
        cluster.kill(f"worker{i}")  # SIGKILL to the process group: the pool's children die with it


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


# --- workers ----------------------------------------------------------------------------------------------------

def test_workers_killed_inside_a_metering_tick_leave_billing_exact_once_they_are_back(cluster, buyer):
    lease_id = order(cluster, buyer, {"gpu_models": ["a100-80gb"], "memory_gb": 20})["leases"][0]
    running(cluster, buyer, lease_id)
    # The buyer's wallet locked: the next tick that posts a minute (at most a minute away) waits inside its
    # transaction, the lease rows locked and its charges computed, and is killed there.
    with row_locked(cluster, "SELECT id FROM marketplace_account WHERE user_id = %s AND kind = 'wallet'",
                    (buyer["id"],)) as conn:
        waiting_on(conn, "marketplace_account")
        kill_workers(cluster)
    restart_workers(cluster)
    charged = lease(cluster, buyer, lease_id)["cost_charged"]
    wait_until(lambda: lease(cluster, buyer, lease_id)["cost_charged"] != charged, timeout=90,
               what="the next minute posted by the restarted workers")
    assert_invariants(cluster)
    end(cluster, buyer, lease_id)
    assert_invariants(cluster)


def test_workers_killed_while_placing_a_queued_order_place_it_once(cluster, buyer):
    whole = {"gpu_models": ["a100-80gb"], "whole_gpu": True}
    holders = [order(cluster, buyer, whole)["leases"][0] for _ in range(2)]
    for lease_id in holders:
        running(cluster, buyer, lease_id)
    queued = order(cluster, buyer, {**whole, "if_unavailable": "queue"})
    assert queued["state"] == "queued", queued
    # The A100s locked: the worker retrying the queue, once a GPU is free, waits inside the placement's
    # transaction (the order locked, its claim half made) and is killed there.
    with row_locked(cluster, "SELECT g.id FROM scheduler_gpu g JOIN scheduler_node n ON n.id = g.node_id "
                             "WHERE n.name = %s", ("f-a100-b",)) as conn:
        end(cluster, buyer, holders[0])
        waiting_on(conn, "scheduler_gpu")
        kill_workers(cluster)
    _, still = cluster.api("GET", f"/api/v1/orders/{queued['id']}/", key=buyer["api_key"])
    assert (still["state"], still["leases"]) == ("queued", [])  # the killed placement left nothing behind
    restart_workers(cluster)

    def placed():
        _, got = cluster.api("GET", f"/api/v1/orders/{queued['id']}/", key=buyer["api_key"])
        return got if got["state"] != "queued" else None
    got = wait_until(placed, timeout=30, what="the queued order placed by the restarted workers")
    assert got["state"] == "placed" and len(got["leases"]) == 1, got
    running(cluster, buyer, got["leases"][0])
    end(cluster, buyer, holders[1], got["leases"][0])
    assert_invariants(cluster)
