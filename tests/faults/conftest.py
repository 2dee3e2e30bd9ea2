"""One production-layout stack for the whole fault suite (tests/e2e/cluster.py): 2 uvicorn processes, 2 Celery
workers and beat on PostgreSQL + its own Redis, agents spread over both web processes, a buyer with credit.

Fault tests share it (package scope: one stack, started once and stopped after the last fault test, so that its
beat and workers do not load the rest of the suite): each injects its fault, lets the stack recover,
puts back what it broke (restarts what it killed) and ends with `assert_invariants(cluster)`."""
from __future__ import annotations

import pytest

from tests.e2e.cluster import running_cluster
from tests.e2e.livestack import wait_until

# MIG slices (H100, A100) and whole GPUs (L4), two nodes per web process.
NODES = [("f-h100-a", "h100-80gb:2"), ("f-a100-b", "a100-80gb:2"), ("f-l4-a", "l4:4"), ("f-l4-b", "l4:4")]
AGENT_WEB = {"f-h100-a": 0, "f-a100-b": 1, "f-l4-a": 0, "f-l4-b": 1}


@pytest.fixture(scope="package")
def fault_cluster(tmp_path_factory):
    # The production heartbeat timeout (15 s), not the e2e tests' 5 s: a fault of the platform's own parts (killed
    # database connections drop agent sockets for a few seconds) must not look like nodes dying.
    yield from running_cluster(tmp_path_factory.mktemp("faults"), nodes=NODES, webs=2, workers=2, concurrency=2,
                               agent_web=AGENT_WEB, agent_interval=0.5, env={"FLEET_HEARTBEAT_TIMEOUT": "15"})


@pytest.fixture(scope="package")
def cluster(fault_cluster):
    """The stack with every agent online (asked of both web processes)."""
    wait_for_online(fault_cluster)
    return fault_cluster


# What a failed fault test may leave behind (it stopped before its own clean-up): its queued and placed orders, their
# leases and a drained node. Put back so that the tests after it start from the stack they expect; the failure is
# still reported, once, where it happened.
LEFT_BEHIND = r"""
from django.db.models import Q
from marketplace.models import Lease, Order
from marketplace.products.orders import order_cancel
from scheduler.models import Node
from scheduler.services.nodes import node_undrain
for o in Order.objects.filter(Q(state=Order.State.QUEUED) | Q(leases__state__in=Lease.OPEN_STATES)).distinct():
    order_cancel(buyer=o.buyer, order_id=o.pk)
for n in Node.objects.filter(Q(status=Node.Status.DRAINING) | Q(drain_requested=True)):
    node_undrain(node=n, by_operator=True)
"""


@pytest.fixture(autouse=True)
def _put_back_after_a_failure(request):
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed > failed and "fault_cluster" in request.fixturenames:
        request.getfixturevalue("fault_cluster").shell(LEFT_BEHIND)


@pytest.fixture(scope="package")
def buyer(cluster) -> dict:
    return cluster.add_buyers(["fault-buyer"], credit="100000")[0]


def wait_for_online(cluster, timeout: float = 60) -> dict:
    def all_online():
        _, body = cluster.api("GET", f"/api/v1/nodes/?limit={len(NODES)}")
        nodes = {n["name"]: n["status"] for n in body.get("results", [])}
        return nodes if all(nodes.get(name) == "online" for name, _ in NODES) else None
    return wait_until(all_online, timeout=timeout, what="every agent online")


LIVE_SLICES = r"""
from scheduler.models import Slice
print("LIVE", Slice.objects.filter(state__in=Slice.ACTIVE_STATES).exclude(error__startswith="adopted").count())
"""


def wait_idle(cluster, timeout: float = 60) -> None:
    """Every earlier test's leases over and their slices destroyed: a test that needs the capacity starts from it."""
    def idle():
        out = cluster._run("manage.py", "shell", "-c", LIVE_SLICES)
        return int(out[out.index("LIVE") + 4:].split()[0]) == 0
    wait_until(idle, timeout=timeout, interval=1, what="no live slice left by earlier tests")
