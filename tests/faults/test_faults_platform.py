"""Faults of the platform's own parts (issue 10): Redis restarted under streaming agents and watching consoles,
PostgreSQL connections killed while orders are placed, one of the two web processes killed. Each runs on the
suite's one stack (conftest.py), puts back what it broke, and ends with the invariants (invariants.py)."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from websockets.sync.client import connect

from tests.e2e.livestack import call_api, wait_until
from tests.faults.conftest import AGENT_WEB, wait_for_online, wait_idle
from tests.faults.invariants import assert_invariants

pytestmark = pytest.mark.e2e

LEASES = r"""
import json
from marketplace.models import Lease
print("LEASES" + json.dumps({str(pk): {"state": state, "end_reason": reason, "ended": ended is not None}
                             for pk, state, reason, ended in
                             Lease.objects.values_list("pk", "state", "end_reason", "ended_at")}))
"""
HEARD = r"""
import json
from scheduler.models import Node
print("HEARD" + json.dumps({n.name: n.last_heartbeat.timestamp() for n in Node.objects.all() if n.last_heartbeat}))
"""
SLICE = {"mode": "on_demand", "memory_gb": 10}


def leases(cluster) -> dict:
    return cluster.shell(LEASES, "LEASES")


def place(cluster, buyer, body: dict, web: int = 0) -> str:
    status, order = cluster.api("POST", "/api/v1/orders/", body, key=buyer["api_key"], web=web)
    assert status == 201, order
    return order["leases"][0]


def wait_running(cluster, lease_ids: list[str], timeout: float = 30) -> None:
    wait_until(lambda: all(leases(cluster)[i]["state"] == "running" for i in lease_ids), timeout=timeout, interval=0.5,
               what=f"leases {lease_ids} running")


def end_all(cluster, buyer, lease_ids) -> None:
    for lease_id in lease_ids:
        status, body = cluster.api("POST", f"/api/v1/leases/{lease_id}/end/", {}, key=buyer["api_key"])
        assert status == 200, body


def node_id(cluster, name: str) -> str:
    _, body = cluster.api("GET", "/api/v1/nodes/?limit=50")
    return next(n["id"] for n in body["results"] if n["name"] == name)


def metrics_frame(cluster, node: str, web: int, timeout: float = 5) -> dict:
    """A metrics frame of `node` on a fresh console socket of web process `web` (the seeded provider's)."""
    with connect(cluster.console_url(web), open_timeout=timeout,
                 additional_headers=cluster.console_headers(cluster.seed["session"], web)) as ws:
        ws.send(json.dumps({"subscribe": {"node": node}}))
        deadline = time.monotonic() + timeout
        while True:
            frame = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if frame.get("type") == "metrics" and frame.get("node") == node:
                return frame


def json_error(body: dict) -> bool:
    return set(body) == {"error"} and {"code", "message"} <= set(body["error"])


def test_a_redis_restart_under_streaming_agents_and_consoles_ends_no_lease_and_restarts_no_web(cluster, buyer):
    node = node_id(cluster, "f-l4-a")
    kept, ended_in_outage = (place(cluster, buyer, {**SLICE, "gpu_models": ["h100-80gb"]}) for _ in range(2))
    wait_running(cluster, [kept, ended_in_outage])
    assert metrics_frame(cluster, node, web=1)["node"] == node
    webs = {name: cluster.procs[name].pid for name in ("web0", "web1")}

    cluster.redis_stop()
    try:
        # The API keeps answering through the outage: a committed request never fails on a side channel.
        status, body = cluster.api("POST", f"/api/v1/leases/{ended_in_outage}/end/", {}, key=buyer["api_key"])
        assert status == 200, body
        status, placed = cluster.api("POST", "/api/v1/orders/", {**SLICE, "gpu_models": ["h100-80gb"]},
                                     key=buyer["api_key"], web=1)
        assert status == 201, placed
        answers = []
        until = time.monotonic() + 10
        while time.monotonic() < until:
            answers.append(cluster.api("GET", f"/api/v1/leases/{kept}/", key=buyer["api_key"], web=len(answers) % 2))
            time.sleep(0.5)
        assert [a for a in answers if a[0] >= 500] == []
    finally:
        cluster.redis_start()

    # Metrics reach a console again within 10 s of Redis being back.
    wait_until(lambda: _metrics_or_none(cluster, node, web=1), timeout=10, interval=0.2,
               what="metrics on a console after Redis came back")
    assert {name: cluster.procs[name].pid for name in webs} == webs
    assert all(cluster.procs[name].poll() is None for name in webs), "a web process exited"
    wait_for_online(cluster)
    after = leases(cluster)
    assert after[kept] == {"state": "running", "end_reason": "", "ended": False}, after[kept]
    assert not [i for i, lease in after.items() if lease["end_reason"] == "node offline"]
    wait_running(cluster, placed["leases"])  # its create_instance waited in the outbox for Redis
    end_all(cluster, buyer, [kept, *placed["leases"]])
    assert_invariants(cluster)


def _metrics_or_none(cluster, node: str, web: int):
    try:
        return metrics_frame(cluster, node, web, timeout=2)
    except Exception:  # refused, closed or silent while the web process's channel layer reconnects to Redis
        return None


def test_postgres_connections_killed_during_order_placement_answer_503_then_the_api_recovers(cluster, buyer):
    body = {**SLICE, "gpu_models": ["h100-80gb", "a100-80gb"]}  # 28 slices of 10 GB: room for the 18 + 5 below
    wait_idle(cluster)
    before = set(leases(cluster))
    in_flight, terminated = threading.Event(), []

    def kill_connections():
        # Three rounds while the orders are in flight: every connection of the cluster's database, the web
        # processes' pooled ones included, is terminated under them.
        in_flight.wait(timeout=10)
        with psycopg.connect(cluster.admin_url, autocommit=True, connect_timeout=10) as admin:
            for _ in range(3):
                terminated.extend(admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                                                "datname = %s AND pid <> pg_backend_pid()", (cluster.database,)))
                time.sleep(0.5)

    def order(i: int) -> tuple[int, dict]:
        in_flight.set()
        return call_api(cluster.web_url(i % 2), "POST", "/api/v1/orders/", body, key=buyer["api_key"], timeout=60)

    killer = threading.Thread(target=kill_connections, daemon=True)
    killer.start()
    try:
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(order, range(18)))
        killer.join(timeout=30)
        assert terminated, "no connection of the cluster's database was terminated"
        wrong = [(s, a) for s, a in answers if not (200 <= s < 300 or (s == 503 and json_error(a)))]
        assert wrong == [], wrong[:3]

        # Recovered without a restart: every agent is back (its socket dropped with its connections) and orders
        # through either web process are placed again.
        wait_for_online(cluster)
        wait_until(lambda: (lambda s, a: a if s == 201 else None)(
            *cluster.api("POST", "/api/v1/orders/", body, key=buyer["api_key"])), timeout=20, interval=0.5,
            what="an order placed after the connections were killed")
        recovered = [place(cluster, buyer, body, web=web) for web in (0, 1, 0, 1)]
        wait_running(cluster, recovered)
        # Those placed under the fault run, or failed (refunded: the invariants) once their commands timed out.
        placed = [i for i, lease in leases(cluster).items() if i not in before]
        wait_until(lambda: all(leases(cluster)[i]["state"] != "provisioning" for i in placed), timeout=60,
                   interval=1, what="the orders placed under the fault settled")
    finally:
        end_all(cluster, buyer, [i for i, lease in leases(cluster).items() if i not in before and not lease["ended"]])
    assert_invariants(cluster)


def test_a_killed_web_process_s_agents_reconnect_to_the_other_and_their_leases_keep_running(cluster, buyer):
    assert AGENT_WEB["f-a100-b"] == 1
    wait_for_online(cluster)
    lease = place(cluster, buyer, {**SLICE, "gpu_models": ["a100-80gb"]})
    wait_running(cluster, [lease])
    killed_at = time.time()
    cluster.kill("web1")
    try:
        # Its agents fail over to web0: heard again (web0's ingest stamps them) well after web1 died.
        wait_until(lambda: cluster.shell(HEARD, "HEARD")["f-a100-b"] > killed_at + 3, timeout=30, interval=0.5,
                   what="f-a100-b heard through web0")
        status, body = cluster.api("GET", f"/api/v1/leases/{lease}/", key=buyer["api_key"], web=0)
        assert status == 200 and body["state"] == "running", body
        assert leases(cluster)[lease] == {"state": "running", "end_reason": "", "ended": False}
    finally:
        cluster.restart("web1")
    wait_for_online(cluster)
    assert leases(cluster)[lease] == {"state": "running", "end_reason": "", "ended": False}
    end_all(cluster, buyer, [lease])
    assert_invariants(cluster)
