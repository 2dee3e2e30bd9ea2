"""Process faults (issue 10): agents and workers killed with -9 at the worst moment, then started again.

Each fault is put at a known point, not left to timing: the simulated machine carves slowly (`--create-seconds`) so
the agent dies between carving and answering; a row lock held by the test on the cluster's own PostgreSQL holds a
worker inside its metering or placement transaction, its backend seen waiting on the test's lock
(`pg_blocking_pids`), when it is killed. Every test puts back what it killed, waits for every agent online, ends
what it placed, and ends with the invariants."""
from __future__ import annotations

import contextlib
import json
import time
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal

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


def restart_agent(cluster, node: str, *extra: str) -> None:
    """Start node's agent again as first started, plus `extra` flags (none: as it was)."""
    name = f"agent-{node}"
    program, argv, env = cluster.spawned[name]
    first = cluster.__dict__.setdefault("_first_argv", {}).setdefault(name, list(argv))
    cluster.spawned[name] = (program, [*first, *extra], env)
    cluster.restart(name)


@contextlib.contextmanager
def row_locked(cluster, sql: str, params: tuple):
    """Hold FOR UPDATE locks on the rows `sql` selects (in the cluster's database) until the block ends; yields the
    connection holding them."""
    with psycopg.connect(cluster.env["DATABASE_URL"], connect_timeout=10) as conn:
        rows = conn.execute(sql + " FOR UPDATE", params).fetchall()
        assert rows, f"nothing to lock: {sql} {params}"
        yield conn
        conn.rollback()


def blocked_by(conn, table: str, holding: tuple[str, object], timeout: float) -> str:
    """Until another backend of the database waits on a row lock `conn` holds, for update, while running a statement
    on `table`, and the row `holding` names (table, pk) is locked elsewhere: the worker is inside the transaction the
    test means to kill it in. That statement. Both are asked: the metrics writer's key-share locks on GPU rows also
    wait on a GPU row held for update (a CI run once took the writer for the placement). Waiting may be through a
    backend that queued on the row first: PostgreSQL queues a row's later waiters behind its first, so
    pg_blocking_pids names the first waiter, not `conn`. Asked on a connection of its own: pg_stat_activity is read
    once per transaction, and `conn`'s transaction lasts as long as its locks."""
    holder = conn.info.backend_pid
    held_table, pk = holding
    with psycopg.connect(conn.info.dsn, autocommit=True, connect_timeout=10) as watcher:
        def waiting():
            row = watcher.execute(
                "SELECT query FROM pg_stat_activity a WHERE datname = current_database() AND state = 'active' "
                "AND query ILIKE %s AND query NOT ILIKE '%%KEY SHARE%%' "
                "AND (%s = ANY(pg_blocking_pids(pid)) OR EXISTS (SELECT FROM pg_stat_activity b "
                "WHERE b.pid = ANY(pg_blocking_pids(a.pid)) AND %s = ANY(pg_blocking_pids(b.pid))))",
                (f"%{table}%", holder, holder)).fetchone()
            return row[0] if row and locked_elsewhere(watcher, held_table, pk) else None
        return wait_until(waiting, timeout=timeout, interval=0.2,
                          what=f"a worker holding {held_table} {pk} and waiting on our lock in {table}")


def locked_elsewhere(conn, table: str, pk) -> bool:
    """Whether another transaction holds a row lock on `table`'s row `pk`. On an autocommit connection the probe's
    own lock, if it gets one, ends with the statement."""
    return conn.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE SKIP LOCKED", (pk,)).fetchone() is None


def kill_workers(cluster) -> None:
    for i in range(cluster.workers):
        cluster.kill(f"worker{i}")  # SIGKILL to the process group: the pool's children die with it


def restart_workers(cluster) -> None:
    for i in range(cluster.workers):
        cluster.restart(f"worker{i}")


def billing(cluster, lease_id: str) -> dict:
    """What the database says of a lease's billing: seconds metered, charged, and what the ledger and the usage
    records hold for it."""
    return cluster.shell(
        "import json; from django.db.models import Sum; from marketplace.models import Lease, LedgerEntry, "
        "UsageRecord; from marketplace.metering import billing_start; "
        f"l = Lease.objects.get(pk={lease_id!r}); "
        "print('BILLING' + json.dumps({'charged': str(l.cost_charged), "
        "'billed_seconds': int((l.billed_until - billing_start(l.started_at)).total_seconds()), "
        "'billed_until': l.billed_until.isoformat(), "
        "'ledger': str(-(LedgerEntry.objects.filter(transaction__lease_id=l.pk, transaction__kind='usage', "
        "account__kind='wallet').aggregate(s=Sum('amount'))['s'] or 0)), "
        "'usage_seconds': UsageRecord.objects.filter(lease_id=l.pk).aggregate(s=Sum('seconds'))['s'] or 0, "
        "'usage_amount': str(UsageRecord.objects.filter(lease_id=l.pk).aggregate(s=Sum('amount'))['s'] or 0)}))",
        "BILLING")


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
    # (What it costs grows by the second while it runs metered; the ledger posts only at a minute's start, so the
    # postings are checked once it has ended, by the invariants.)
    cost = Decimal(lease(cluster, buyer, lease_id)["cost"])
    wait_until(lambda: Decimal(lease(cluster, buyer, lease_id)["cost"]) > cost, timeout=10, what="metering to go on")
    after = lease(cluster, buyer, lease_id)
    assert (after["state"], after["connection"]["device_uuid"]) == ("running", instance)
    assert agent_instances(cluster, node) == server_instances(cluster, node) and instance in server_instances(
        cluster, node)
    assert_invariants(cluster)
    end(cluster, buyer, lease_id)
    got = billing(cluster, lease_id)  # posted to the second it ended, the kill included, once
    assert got["ledger"] == got["charged"] and got["usage_seconds"] == got["billed_seconds"] > 0, got
    wait_until(lambda: instance not in agent_instances(cluster, node), timeout=15, what="the instance destroyed")
    assert_invariants(cluster)


# --- workers ----------------------------------------------------------------------------------------------------

def test_workers_killed_inside_a_metering_tick_leave_billing_exact_once_they_are_back(cluster, buyer):
    lease_id = order(cluster, buyer, {"gpu_models": ["a100-80gb"], "memory_gb": 20})["leases"][0]
    running(cluster, buyer, lease_id)
    # The buyer's wallet locked: the tick that posts the lease's minute (the next minute's start, at most a minute
    # away: a tick writes only then) locks the lease, computes the charge and waits here, inside its transaction.
    with row_locked(cluster, "SELECT id FROM marketplace_account WHERE user_id = %s AND kind = 'wallet'",
                    (buyer["id"],)) as conn:
        blocked_by(conn, "marketplace_account", holding=("marketplace_lease", lease_id), timeout=75)
        kill_workers(cluster)
    assert billing(cluster, lease_id)["charged"] == "0.000000"  # the killed tick posted nothing
    restart_workers(cluster)
    wait_until(lambda: billing(cluster, lease_id)["charged"] != "0.000000", timeout=30,
               what="the minute posted by the restarted workers")
    got = billing(cluster, lease_id)
    # Posted once: the ledger, the lease and the usage records agree, to the second and the micro-dollar.
    assert got["ledger"] == got["charged"] == got["usage_amount"], got
    assert got["usage_seconds"] == got["billed_seconds"] > 0, got
    assert_invariants(cluster)
    end(cluster, buyer, lease_id)
    got = billing(cluster, lease_id)
    assert got["ledger"] == got["charged"] and got["usage_seconds"] == got["billed_seconds"], got
    assert_invariants(cluster)


def order_state(cluster, buyer, order_id: str) -> dict:
    return cluster.api("GET", f"/api/v1/orders/{order_id}/", key=buyer["api_key"])[1]


def node_id(cluster, name: str) -> str:
    _, body = cluster.api("GET", "/api/v1/nodes/?limit=20")
    return next(n["id"] for n in body["results"] if n["name"] == name)


def test_workers_killed_while_placing_a_queued_order_place_it_once(cluster, buyer):
    node = "f-a100-b"
    status, body = cluster.api("POST", f"/api/v1/nodes/{node_id(cluster, node)}/drain/")
    assert status == 200 and body["status"] == "draining", body
    queued = order(cluster, buyer, {"gpu_models": ["a100-80gb"], "whole_gpu": True, "if_unavailable": "queue"})
    assert queued["state"] == "queued", queued  # the only A100s are on the draining node
    # Its GPUs locked: once the node is back, the worker retrying the queue locks the order, decides on a GPU and
    # waits for that GPU's row, inside the placement's transaction. Undraining writes the node's row only, so the
    # capacity comes back with the lock held.
    with row_locked(cluster, "SELECT id FROM scheduler_gpu WHERE node_id = (SELECT id FROM scheduler_node "
                             "WHERE name = %s)", (node,)) as conn:
        cluster.shell("from scheduler.models import Node; from scheduler.services.nodes import node_undrain; "
                      f"node_undrain(node=Node.objects.get(name={node!r}))")
        blocked_by(conn, "scheduler_gpu", holding=("marketplace_order", queued["id"]), timeout=30)
        kill_workers(cluster)
    still = order_state(cluster, buyer, queued["id"])
    assert (still["state"], still["leases"]) == ("queued", [])  # the killed placement left nothing behind
    restart_workers(cluster)

    def placed():
        got = order_state(cluster, buyer, queued["id"])
        return got if got["state"] != "queued" else None
    got = wait_until(placed, timeout=30, what="the queued order placed by the restarted workers")
    assert got["state"] == "placed" and len(got["leases"]) == 1, got
    running(cluster, buyer, got["leases"][0])
    wait_for_online(cluster)
    end(cluster, buyer, got["leases"][0])
    assert_invariants(cluster)


# --- beat -------------------------------------------------------------------------------------------------------

BEAT_DOWN_SECONDS = 25


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def refunded(cluster, reservation_id: str) -> Decimal:
    """What the holder got back for the reservation's undelivered time (its wallet's side of the refund)."""
    return Decimal(cluster.shell(
        "from marketplace.models import LedgerEntry; "
        "e = LedgerEntry.objects.filter(transaction__idempotency_key='reservation-refund:" + reservation_id + "', "
        "account__kind='wallet').first(); print('REFUND\"' + str(e.amount if e else 0) + '\"')", "REFUND"))


def test_beat_stopped_then_restarted_catches_up_metering_starts_a_window_late_refunded_and_ends_a_noticed_spot(
        cluster, buyer):
    """The issue stops beat for 5 minutes; with the cluster's fast beat (0.5 s ticks, 2 s notices) 25 s holds the
    same events: a minute's posting falls due, a reserved window starts and a spot notice's deadline passes, all while
    beat is down."""
    metered = order(cluster, buyer, {"gpu_models": ["a100-80gb"], "memory_gb": 20})["leases"][0]
    spots = []
    for _ in range(2):  # both H100s
        status, bid = cluster.api("POST", "/api/v1/bids/", {"gpu_models": ["h100-80gb"], "whole_gpu": True,
                                                            "max_price_per_hour": "2.00"}, key=buyer["api_key"])
        assert status == 201, bid
        spots.append(bid["order"]["leases"][0])
    for lease_id in (metered, *spots):
        running(cluster, buyer, lease_id)
    # Down from late in a minute, so that the window (4 s on) starts in this minute and the next minute's posting
    # falls due while beat is down.
    wait_until(lambda: 60 - BEAT_DOWN_SECONDS + 1 <= datetime.now(timezone.utc).second <= 50, timeout=65,
               interval=0.2, what="the second half of a minute")
    start = datetime.now(timezone.utc) + timedelta(seconds=4)
    status, booked = cluster.api("POST", "/api/v1/orders/", {
        "mode": "reserved", "gpu_models": ["l4"], "window_start": start.isoformat(),
        "window_end": (start + timedelta(seconds=30)).isoformat()}, key=buyer["api_key"])
    assert status == 201, booked
    reservation_id = booked["reservations"][0]

    cluster.kill("beat")
    down = datetime.now(timezone.utc)
    due = down.replace(second=0, microsecond=0) + timedelta(minutes=1)
    assert down < start < due < down + timedelta(seconds=BEAT_DOWN_SECONDS)
    # An on-demand order takes an H100 from a spot lease: its notice is given in the request (2 s), beat is down.
    status, higher = cluster.api("POST", "/api/v1/orders/", {"mode": "on_demand", "gpu_models": ["h100-80gb"],
                                                             "whole_gpu": True, "if_unavailable": "queue"},
                                 key=buyer["api_key"])
    assert status == 202 and higher["state"] == "queued", higher
    (noticed,) = [x for x in (lease(cluster, buyer, i) for i in spots) if x["state"] == "interrupting"]
    deadline = at(noticed["interruption"]["deadline"])
    time.sleep(max(0.0, (down + timedelta(seconds=BEAT_DOWN_SECONDS) - datetime.now(timezone.utc)).total_seconds()))
    # Nothing moved while beat was down: the window did not start, the notice ran out, the minute was not posted.
    assert cluster.api("GET", f"/api/v1/reservations/{reservation_id}/", key=buyer["api_key"])[1]["state"] == "booked"
    assert lease(cluster, buyer, noticed["id"])["state"] == "interrupting" and deadline < datetime.now(timezone.utc)
    assert at(billing(cluster, metered)["billed_until"]) < due
    cluster.restart("beat")

    # (c) The notice is honoured: the spot lease ends at its deadline, billed no further; the order takes its GPU.
    wait_until(lambda: lease(cluster, buyer, noticed["id"])["state"] == "ended", timeout=20, what="the spot ended")
    gone = lease(cluster, buyer, noticed["id"])
    assert at(gone["ended_at"]) == deadline and at(gone["billed_until"]) <= deadline, gone
    placed = wait_until(lambda: order_state(cluster, buyer, higher["id"])["leases"], timeout=20,
                        what="the on-demand order placed on the freed H100")
    running(cluster, buyer, placed[0])
    # (a) Metering catches up: the minute due while beat was down is posted, once, to the second.
    wait_until(lambda: at(billing(cluster, metered)["billed_until"]) >= due, timeout=20, what="the minute posted")
    got = billing(cluster, metered)
    assert got["ledger"] == got["charged"] == got["usage_amount"] and got["usage_seconds"] == got["billed_seconds"]
    # (b) The window starts late, and the time from its start until its lease ran is refunded when it ends.
    wait_until(lambda: cluster.api("GET", f"/api/v1/reservations/{reservation_id}/", key=buyer["api_key"])[1][
        "state"] == "done", timeout=40, what="the window over")
    r = cluster.api("GET", f"/api/v1/reservations/{reservation_id}/", key=buyer["api_key"])[1]
    (window,) = [x for x in cluster.api("GET", "/api/v1/leases/?mode=reserved&limit=50", key=buyer["api_key"])[1][
        "results"] if x["reservation"] == reservation_id]
    lost = (at(window["started_at"]) - at(r["starts_at"])).total_seconds()
    assert lost >= BEAT_DOWN_SECONDS - 4 - 1, (window, r)
    expected = (Decimal(r["price_total"]) * Decimal(str(lost)) / Decimal(30)).quantize(Decimal("0.000001"),
                                                                                      ROUND_HALF_UP)
    assert refunded(cluster, reservation_id) == expected > 0

    end(cluster, buyer, metered, placed[0], *[i for i in spots if i != noticed["id"]])
    got = billing(cluster, metered)
    assert got["ledger"] == got["charged"] and got["usage_seconds"] == got["billed_seconds"], got
    assert_invariants(cluster)
