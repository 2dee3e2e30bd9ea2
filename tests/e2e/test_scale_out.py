"""The production layout scales out (docs/deployment.md): two uvicorn processes, two Celery workers and beat on
PostgreSQL + Redis, agents connected to different web processes. Live data and market events cross processes
through Redis, and orders placed through either web process never take the same GPU twice (PostgreSQL's row
locks), with every refusal in the API's one JSON error shape and no 5xx."""
from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
from websockets.sync.client import connect

from tests.e2e.cluster import running_cluster
from tests.e2e.livestack import call_api, wait_until

pytestmark = [pytest.mark.e2e]

# 50 whole L4s on five nodes (L4 has no MIG: one order for a whole GPU takes exactly one), spread over both webs,
# and an A10 for the market event.
L4_NODES, L4_PER_NODE = 5, 10
NODES = [(f"l4-{i}", f"l4:{L4_PER_NODE}") for i in range(L4_NODES)] + [("a10", "a10:1")]
AGENT_WEB = {name: i % 2 for i, (name, _) in enumerate(NODES)} | {"a10": 0}
CAPACITY = L4_NODES * L4_PER_NODE
ORDERS = 200
# All 200 in flight at once: two OS processes, one per web process, each sending its 100 from 100 threads. Each web
# process draws its database connections from its pool (DB_POOL_MAX, 10 by default), so the burst queues for
# connections instead of opening 200 (before the pool: 2 x 25 in flight gave 20 answers 500 "too many clients").
ORDER = {"mode": "on_demand", "gpu_models": ["l4"], "whole_gpu": True}

OPEN_LEASES = r"""
import json
from marketplace.models import Lease
rows = list(Lease.objects.filter(state__in=Lease.OPEN_STATES, order__gpu_models=["l4"])
            .values_list("slice_id", "slice__gpu_id", "state"))
print("LEASES" + json.dumps({"count": len(rows), "slices": len({r[0] for r in rows}),
                             "gpus": len({r[1] for r in rows}), "running": sum(r[2] == "running" for r in rows)}))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # The burst of 100 per web process waits its turn for one of 10 connections; on a loaded 2-core machine the last
    # can wait past the default 30 s and get the pool's 503 (tests/config/test_db_pool.py tests that answer). This
    # test is about the row locks, so its webs wait as long as its clients do. (The 503s CI saw here were deadlock
    # victims: orders now retry those, scheduler/services/transactions.py.)
    yield from running_cluster(tmp_path_factory.mktemp("scale-out"), nodes=NODES, webs=2, workers=2,
                               concurrency=2, agent_web=AGENT_WEB, agent_interval=0.5, env={"DB_POOL_TIMEOUT": "110"})


@pytest.fixture(scope="module")
def buyer(cluster):
    return cluster.add_buyers(["scale-buyer"], credit="1000000")[0]


@pytest.fixture(scope="module")
def online(cluster):
    """Every agent registered, each through its own web process; asked of the other web."""
    def all_online():
        _, body = cluster.api("GET", f"/api/v1/nodes/?limit={len(NODES)}", web=1)
        nodes = {n["name"]: n for n in body.get("results", [])}
        return nodes if [nodes.get(name, {}).get("status") for name, _ in NODES] == ["online"] * len(NODES) else None
    return wait_until(all_online, timeout=60, what="every agent online")


def other(web: int) -> int:
    return 1 - web


def test_an_agents_metrics_reach_a_console_on_the_other_web_process(cluster, online):
    for name in ("l4-0", "l4-1"):  # one agent on each web process
        node = online[name]
        web = other(AGENT_WEB[name])
        with connect(cluster.console_url(web), open_timeout=10,
                     additional_headers=cluster.console_headers(cluster.seed["session"], web)) as ws:
            ws.send(json.dumps({"subscribe": {"node": node["id"]}}))
            assert json.loads(ws.recv(timeout=10)) == {"type": "subscribed", "node": node["id"]}
            frame = wait_until(lambda: (lambda f: f if f["type"] == "metrics" else None)(json.loads(ws.recv(timeout=10))),
                               timeout=15, what=f"metrics of {name} on web{web}")
        assert frame["node"] == node["id"] and len(frame["gpus"]) == L4_PER_NODE


def test_a_lease_going_running_reaches_the_buyers_console_on_the_other_web_process(cluster, online, buyer):
    web = AGENT_WEB["a10"]
    with connect(cluster.console_url(other(web)), open_timeout=10,
                 additional_headers=cluster.console_headers(buyer["session"], other(web))) as ws:
        status, order = cluster.api("POST", "/api/v1/orders/", {"mode": "on_demand", "gpu_models": ["a10"],
                                                                "whole_gpu": True}, key=buyer["api_key"], web=web)
        assert status == 201, order
        lease = order["leases"][0]

        def running_event():
            message = json.loads(ws.recv(timeout=15))
            event = message.get("event", {})
            return event if message["type"] == "market" and event.get("type") == "lease_running" else None
        event = wait_until(running_event, timeout=20, what="lease_running on the buyer's console")
    assert event["lease"] == lease
    assert cluster.api("GET", f"/api/v1/leases/{lease}/", key=buyer["api_key"], web=other(web))[1]["state"] == "running"


def _burst(url: str, key: str, count: int) -> list[tuple[int, dict]]:
    """`count` orders at once through one web process (run in its own OS process)."""
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: call_api(url, "POST", "/api/v1/orders/", ORDER, key=key, timeout=120),
                             range(count)))


def test_concurrent_orders_through_both_web_processes_never_take_a_gpu_twice(cluster, online, buyer):
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as senders:
        bursts = senders.map(_burst, cluster.web_urls, [buyer["api_key"]] * 2, [ORDERS // 2] * 2)
        answers = [answer for burst in bursts for answer in burst]

    statuses = [status for status, _ in answers]
    server_errors = [(status, answer) for status, answer in answers if status >= 500]
    assert server_errors == [], f"{len(server_errors)} answers were 5xx: {server_errors[:3]}"
    placed = [answer for status, answer in answers if status == 201]
    refused = [answer for status, answer in answers if status != 201]
    assert len(placed) == CAPACITY, f"{len(placed)} orders placed for {CAPACITY} GPUs (statuses: {sorted(set(statuses))})"
    assert all(len(answer["leases"]) == 1 for answer in placed)
    assert len(refused) == ORDERS - CAPACITY
    assert all(set(answer) == {"error"} and {"code", "message"} <= set(answer["error"]) for answer in refused), \
        refused[:3]
    assert {answer["error"]["code"] for answer in refused} == {"unavailable"}, refused[:3]

    leases = cluster.shell(OPEN_LEASES, "LEASES")
    assert leases["count"] == leases["slices"] == leases["gpus"] == CAPACITY
    # Each agent carved what its web process was told by the other one too: all 50 run.
    wait_until(lambda: cluster.shell(OPEN_LEASES, "LEASES")["running"] == CAPACITY, timeout=60, interval=1,
               what="all 50 leases running on their agents")
