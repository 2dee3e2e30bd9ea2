"""Workloads end to end on a real engine: the real ASGI server, Celery worker and beat, and real agent processes
whose simulated GPUs run buyers' containers on Podman (`--runtime docker --engine-url ...`), driven through the
REST API as a buyer scripts it. What a buyer gets: HTTP on the mapped host port, an SSH login with their key (and
not another), a job that ends its lease at its exit billed for its running seconds to the micro-dollar, a spot
notice that reaches the container's SIGTERM trap before the kill, an agent killed with -9 whose containers are
adopted when it is back, a missing image failing with the engine's reason and a refund, and nothing left behind."""
from __future__ import annotations

import json
import urllib.request
import uuid
from datetime import datetime
from decimal import Decimal

import docker
import pytest

from nodeagent.runtime.base import LABEL_LEASE, LABEL_NODE, container_name
from nodeagent.runtime.docker import listed_containers
from tests.e2e.livestack import LiveStack, wait_until
from tests.engine.images import INDEX_HTML
from tests.enginefix import free_port_block, remove_quietly, ssh, ssh_keypair

pytestmark = [pytest.mark.e2e]

NODES = [("e2e-box", "a100-80gb:1"), ("e2e-l4", "l4:1")]
HOSTS = [f"{name}.e2e" for name, _ in NODES]  # the agents label their containers with their host names

BUYER = r"""
import json
from decimal import Decimal
from django.contrib.auth import get_user_model
from marketplace.money import ledger
from marketplace.products.apikeys import api_key_create
from marketplace.products.workloads import ssh_key_add
from scheduler.models import Node
spec = json.loads(%r)
# Buyers reach published ports on loopback; a 1g.10gb slice (1/7 of an A100) gets 1 CPU and 1 GB of these.
Node.objects.update(public_address="127.0.0.1", port_range_start=spec["ports"][0], port_range_end=spec["ports"][1],
                    cpus_per_gpu=Decimal("7"), ram_gb_per_gpu=Decimal("7"))
buyer = get_user_model().objects.create_user("e2e-buyer", password="e2e-password")
ledger.post(kind="topup", memo="e2e top-up", idempotency_key="e2e-topup",
            lines=[(ledger.platform_account("stripe_clearing"), Decimal("-100")),
                   (ledger.account_for(user=buyer, kind="wallet"), Decimal("100"))])
ssh_key_add(user=buyer, name="laptop", public_key=spec["key"])
_, key = api_key_create(user=buyer, name="e2e")
print("BUYER" + json.dumps({"api_key": key}))
"""

BOOKS = r"""
import json
from marketplace.models import Lease, LedgerEntry
from marketplace.money.check import ledger_check
lease = Lease.objects.select_related("slice", "run").get(pk=%r)
charged = sum(e.amount for e in LedgerEntry.objects.filter(transaction__lease_id=lease.pk, transaction__kind="usage",
                                                           account__kind="wallet"))
print("BOOKS" + json.dumps({
    "problems": ledger_check(), "charged": str(-charged), "cost_charged": str(lease.cost_charged),
    "price_per_hour": str(lease.price_per_hour),
    "run_started": lease.run.started_at.isoformat() if lease.run.started_at else None,
    "run_finished": lease.run.finished_at.isoformat() if lease.run.finished_at else None,
    "slice": lease.slice.state}))
"""


class Live:
    """The stack, the buyer's API key, the engine, and what a buyer does with them."""

    def __init__(self, stack: LiveStack, key: str, engine, keys: dict):
        self.stack, self.key, self.engine, self.keys = stack, key, engine, keys

    def order(self, body: dict) -> dict:
        status, data = self.stack.api("POST", "/api/v1/orders/", body, key=self.key)
        assert status in (201, 202), data
        return data

    def lease(self, lease_id: str) -> dict:
        status, data = self.stack.api("GET", f"/api/v1/leases/{lease_id}/", key=self.key)
        assert status == 200, data
        return data

    def wait(self, lease_id: str, predicate, what: str, timeout: float = 60) -> dict:
        try:
            return wait_until(lambda: (lambda x: x if predicate(x) else None)(self.lease(lease_id)),
                              timeout=timeout, interval=0.25, what=f"lease {lease_id[:8]} {what}")
        except AssertionError:
            print(self.stack.logs())
            raise

    def running(self, lease_id: str, timeout: float = 60) -> dict:
        return self.wait(lease_id, lambda x: x["state"] == "running", "running", timeout)

    def over(self, lease_id: str, timeout: float = 60) -> dict:
        return self.wait(lease_id, lambda x: x["state"] in ("ended", "failed"), "over", timeout)

    def end(self, lease_id: str) -> None:
        status, data = self.stack.api("POST", f"/api/v1/leases/{lease_id}/end/", {}, key=self.key)
        assert status == 200, data

    def logs(self, lease_id: str) -> str:
        req = urllib.request.Request(f"{self.stack.url}/api/v1/leases/{lease_id}/logs/",
                                     headers={"Authorization": f"Bearer {self.key}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.read().decode()

    def wallet(self) -> Decimal:
        status, data = self.stack.api("GET", "/api/v1/wallet/", key=self.key)
        assert status == 200, data
        return Decimal(data["balance"])

    def books(self, lease_id: str) -> dict:
        out = self.stack._run("manage.py", "shell", "-c", BOOKS % lease_id)
        return json.loads(out[out.index("BOOKS") + 5:])

    def containers(self, lease_id: str | None = None) -> list:
        label = f"{LABEL_LEASE}={lease_id}" if lease_id else LABEL_LEASE
        found = []
        for listed in listed_containers(self.engine, {"label": label}):
            if listed["labels"].get(LABEL_NODE) in HOSTS:
                try:
                    found.append(self.engine.containers.get(listed["id"]))
                except docker.errors.APIError:  # removed since it was listed (Podman: a 500, not a 404)
                    pass
        return found


def slice_order(workload: dict, **extra) -> dict:
    return {"mode": "on_demand", "gpu_models": ["a100-80gb"], "memory_gb": 10, "duration_seconds": 900,
            "workload": workload, **extra}


@pytest.fixture(scope="module")
def live(tmp_path_factory, engine_url, engine, busybox_image, sshd_image):
    tmp = tmp_path_factory.mktemp("workloads-live")
    keys = {"buyer": ssh_keypair(tmp, "buyer"), "stranger": ssh_keypair(tmp, "stranger")}
    stack = LiveStack(tmp, nodes=NODES, agent_interval=0.5, env={
        "FLEET_HEARTBEAT_TIMEOUT": "30", "FLEET_OFFLINE_CHECK": "1", "MARKET_METER_SECONDS": "0.5",
        "MARKET_LEASE_TICK_SECONDS": "0.5", "MARKET_QUEUE_SECONDS": "0.5", "MARKET_PREEMPT_NOTICE_SECONDS": "4",
        "MARKET_WORKLOAD_STOP_GRACE_SECONDS": "2"},
        agent_args=("--runtime", "docker", "--engine-url", engine_url, "--gpu-devices", "none",
                    "--bind-address", "127.0.0.1"))
    try:
        with stack.running():
            out = stack._run("manage.py", "shell", "-c", BUYER % json.dumps(
                {"ports": free_port_block(40), "key": keys["buyer"][1]}))
            live = Live(stack, json.loads(out[out.index("BUYER") + 5:])["api_key"], engine, keys)
            wait_until(lambda: all(n["status"] == "online" for n in stack.api("GET", "/api/v1/nodes/")[1]["results"]),
                       timeout=60, what="both agents online")
            yield live
    finally:
        for listed in listed_containers(engine, {"label": LABEL_LEASE}):
            if listed["labels"].get(LABEL_NODE) in HOSTS:
                remove_quietly(engine, listed["id"])


def test_http_and_ssh_reach_their_containers_on_distinct_host_ports_and_ending_leaves_nothing(live):
    volumes_before = {v.name for v in live.engine.volumes.list()}
    web = live.order(slice_order({"image": "localhost/gpm-busybox:test", "ports": [{"port": 8080, "kind": "http"}]}))
    box = live.order(slice_order({"image": "localhost/gpm-sshd:test", "ports": [{"port": 22}]}))
    web_id, box_id = web["leases"][0], box["leases"][0]
    web_lease, box_lease = live.running(web_id), live.running(box_id)
    url = web_lease["connection"]["urls"][0]
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.read() == INDEX_HTML
    line = box_lease["connection"]["ssh"]
    assert line.startswith("ssh -p ") and line.endswith(" root@127.0.0.1")
    ok = wait_until(lambda: (lambda r: r if r.returncode == 0 else None)(ssh(live.keys["buyer"][0], "echo from-$(hostname)", line)),
                    timeout=20, what="an SSH login with the buyer's key")
    assert ok.stdout.startswith("from-")
    refused = ssh(live.keys["stranger"][0], "echo no", line)
    assert refused.returncode != 0 and "no" not in refused.stdout
    hosts = [p["host_port"] for lease in (web_lease, box_lease) for p in lease["connection"]["ports"]]
    assert len(hosts) == len(set(hosts)) == 2
    # The container got the slice's share of the node's CPUs and RAM (1/7 of 7 CPUs and 7 GB), labelled.
    (container,) = live.containers(web_id)
    assert container.name == container_name(web_id)
    host_config = container.attrs["HostConfig"]
    assert host_config["NanoCpus"] == 1_000_000_000 and host_config["Memory"] == 1024 * 1024 * 1024
    assert not host_config["Privileged"]
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    assert env["CUDA_VISIBLE_DEVICES"] == web_lease["connection"]["device_uuid"]
    for lease_id in (web_id, box_id):
        live.end(lease_id)
    for lease_id in (web_id, box_id):
        assert live.over(lease_id)["state"] == "ended"
        assert live.books(lease_id)["slice"] == "destroyed"
    assert live.containers(web_id) == [] and live.containers(box_id) == []
    assert {v.name for v in live.engine.volumes.list()} == volumes_before  # its /data volume went with it


def test_a_job_ends_its_lease_at_its_exit_and_is_billed_its_running_seconds_to_the_micro_dollar(live):
    job = live.order(slice_order({"image": "localhost/gpm-busybox:test", "kind": "job",
                                  "command": ["sh", "-c", "echo hi; sleep 2; exit 3"]}))
    lease_id = job["leases"][0]
    lease = live.over(lease_id)
    assert lease["state"] == "ended" and lease["end_reason"] == "job finished with code 3"
    assert lease["workload"]["exit_code"] == 3 and lease["workload"]["state"] == "removed"
    assert "hi" in live.logs(lease_id)
    books = live.books(lease_id)
    assert books["problems"] == [] and books["slice"] == "destroyed"
    # Billed from the container's start (truncated to the second, as all billing) to its exit, once.
    started = datetime.fromisoformat(books["run_started"]).replace(microsecond=0)
    seconds = int((datetime.fromisoformat(books["run_finished"]) - started).total_seconds())
    assert 2 <= seconds <= 4, books
    expected = (Decimal(books["price_per_hour"]) * seconds / 3600).quantize(Decimal("0.000001"))
    assert Decimal(books["charged"]) == Decimal(books["cost_charged"]) == expected
    assert live.containers(lease_id) == []


def test_a_spot_notice_reaches_the_containers_sigterm_trap_before_the_kill_at_the_deadline(live):
    trap = ("trap 'echo got-term' TERM; i=0; while true; do i=$((i+1)); echo tick-$i; sleep 0.5; done")
    spot = live.order({"mode": "spot", "gpu_models": ["l4"], "whole_gpu": True, "max_price_per_hour": "3",
                       "duration_seconds": 900, "workload": {"image": "localhost/gpm-busybox:test",
                                                             "command": ["sh", "-c", trap]}})
    spot_id = spot["leases"][0]
    live.running(spot_id)
    wait_until(lambda: "tick-2" in live.logs(spot_id), timeout=20, what="the container's first lines")
    # An on-demand order for the same GPU preempts it: a notice now, the kill at the deadline.
    taker = live.order({"mode": "on_demand", "gpu_models": ["l4"], "whole_gpu": True, "duration_seconds": 600,
                        "if_unavailable": "queue"})
    lease = live.wait(spot_id, lambda x: x["interruption"] is not None, "interrupted")
    assert lease["interruption"]["kind"] == "preempted"
    wait_until(lambda: "got-term" in live.logs(spot_id), timeout=20, what="the SIGTERM trap's line")
    assert live.over(spot_id)["end_reason"] == "interrupted"
    out = live.logs(spot_id)
    after = out[out.index("got-term"):]
    assert "tick-" in after, out  # it kept running after the notice, until the kill at the deadline
    assert live.containers(spot_id) == []
    placed = wait_until(lambda: (lambda o: o if o["state"] == "placed" else None)(
        live.stack.api("GET", f"/api/v1/orders/{taker['id']}/", key=live.key)[1]), timeout=30,
        what="the preempting order placed")
    live.end(placed["leases"][0])
    live.over(placed["leases"][0])


def test_an_agent_killed_with_9_has_its_containers_adopted_when_it_is_back_and_leftovers_removed(live, engine):
    # A whole L4: the test is about containers, not MIG instances (the fault suite kills agents holding those).
    keep = live.order({"mode": "on_demand", "gpu_models": ["l4"], "whole_gpu": True, "duration_seconds": 900,
                       "workload": {"image": "localhost/gpm-busybox:test"}})["leases"][0]
    live.running(keep)
    (before,) = live.containers(keep)
    node = next(n for n in live.stack.seed["nodes"] if n["name"] == "e2e-l4")
    live.stack.kill("agent-e2e-l4")  # SIGKILL: no goodbye; its containers keep running
    # A leftover of a lease this server never had (an earlier life of the node), in the agent's namespace.
    ghost = str(uuid.uuid4())
    engine.containers.run("localhost/gpm-busybox:test", ["sleep", "600"], name=container_name(ghost), detach=True,
                          labels={LABEL_LEASE: ghost, LABEL_NODE: "e2e-l4.e2e"})
    live.stack.start_agent(node)
    wait_until(lambda: not live.containers(ghost), timeout=30, what="the leftover removed")
    after = live.containers(keep)
    assert [c.id for c in after] == [before.id]  # adopted, not started again
    assert live.lease(keep)["state"] == "running"
    live.end(keep)
    assert live.over(keep)["state"] == "ended" and live.containers(keep) == []


def test_a_missing_image_fails_the_lease_with_the_engines_reason_refunds_it_and_leaves_nothing(live):
    wallet_before = live.wallet()
    order = live.order(slice_order({"image": "localhost/does-not-exist:1"}))
    lease_id = order["leases"][0]
    lease = live.over(lease_id)
    assert lease["state"] == "failed" and lease["end_reason"] == "workload failed"
    assert "does-not-exist" in lease["workload"]["error"]
    status, failed = live.stack.api("GET", f"/api/v1/orders/{order['id']}/", key=live.key)
    assert failed["state"] == "failed" and "the workload did not start" in failed["explain"]
    books = live.books(lease_id)
    assert books["slice"] == "destroyed" and Decimal(books["cost_charged"]) == 0
    assert live.wallet() == wallet_before  # the first minutes it had to cover were never charged
    assert live.containers(lease_id) == []
