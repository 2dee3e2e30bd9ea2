"""The market end to end through the REST API, with the real ASGI server, Celery worker and beat (periods
shortened through the environment) and real `python -m nodeagent --simulate` processes on loopback: on demand
to the cent, spot interrupted by a higher class with a notice, a reserved window started by the beat."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.e2e.livestack import LiveStack, wait_until

pytestmark = [pytest.mark.e2e]

BUYER = r"""
import json
from decimal import Decimal
from django.contrib.auth import get_user_model
from marketplace.money import ledger
from marketplace.products.apikeys import api_key_create
from scheduler.models import Node
Node.objects.update(price_per_gpu_hour=Decimal("360.00"))  # dear, so seconds of use are worth whole cents
buyer = get_user_model().objects.create_user("e2e-buyer", password="e2e-password")
ledger.post(kind="topup", memo="e2e top-up", idempotency_key="e2e-topup",
            lines=[(ledger.platform_account("stripe_clearing"), Decimal("-1000")),
                   (ledger.account_for(user=buyer, kind="wallet"), Decimal("1000"))])
_, key = api_key_create(user=buyer, name="e2e")
print("BUYER" + json.dumps({"api_key": key}))
"""

BOOKS = r"""
import json
from marketplace.models import UsageRecord
from marketplace.money import ledger
from marketplace.money.check import ledger_check
usage = {}
for lease_id, seconds in UsageRecord.objects.values_list("lease_id", "seconds"):
    usage[str(lease_id)] = usage.get(str(lease_id), 0) + seconds
print("BOOKS" + json.dumps({"problems": ledger_check(), "usage": usage}))
"""


class Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 (http.server's naming)
        Hook.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook_url():
    Hook.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/notices"
    server.shutdown()


@pytest.fixture
def stack(tmp_path):
    s = LiveStack(tmp_path, nodes=[("e2e-a100", "a100-80gb:1"), ("e2e-l4", "l4:1")], agent_interval=0.5, env={
        "FLEET_HEARTBEAT_TIMEOUT": "5", "FLEET_OFFLINE_CHECK": "1",
        "MARKET_METER_SECONDS": "0.5", "MARKET_LEASE_TICK_SECONDS": "0.5", "MARKET_QUEUE_SECONDS": "0.5",
        "MARKET_SPOT_NOTICE_SECONDS": "2", "MARKET_PREEMPT_NOTICE_SECONDS": "2"})
    with s.running():
        yield s


def shell(stack: LiveStack, code: str, tag: str) -> dict:
    out = stack._run("manage.py", "shell", "-c", code)
    return json.loads(out[out.index(tag) + len(tag):])


def api(stack: LiveStack, key: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(stack.url + "/api/v1" + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def cents(value: Decimal) -> str:
    return str(value.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def test_orders_in_three_modes_run_on_real_agents_and_the_books_and_statement_are_right_to_the_cent(stack, hook_url):
    key = shell(stack, BUYER, "BUYER")["api_key"]
    wait_until(lambda: len([n for n in api(stack, key, "GET", "/offers/")[1].get("results", [])]) >= 2,
               timeout=20, what="both agents' GPUs in the catalog")

    def lease(lease_id: str) -> dict:
        return api(stack, key, "GET", f"/leases/{lease_id}/")[1]

    def order(order_id: str) -> dict:
        return api(stack, key, "GET", f"/orders/{order_id}/")[1]

    # A reserved window on the L4 a few seconds ahead: the beat starts its lease at the start, ends it at the end.
    start = datetime.now(timezone.utc) + timedelta(seconds=5)
    status, booked = api(stack, key, "POST", "/orders/", {
        "mode": "reserved", "gpu_models": ["l4"], "window_start": start.isoformat(),
        "window_end": (start + timedelta(seconds=4)).isoformat()})
    assert status == 201, booked
    reservation_id = booked["reservations"][0]

    # On demand: a MIG slice of the A100 for 3 s of running.
    status, od = api(stack, key, "POST", "/orders/", {"mode": "on_demand", "gpu_models": ["a100-80gb"],
                                                      "memory_gb": 10, "duration_seconds": 3})
    assert status == 201, od
    od_lease = od["leases"][0]
    running = wait_until(lambda: (lambda x: x if x["state"] == "running" else None)(lease(od_lease)),
                         timeout=15, what="the on-demand lease running")
    assert running["connection"]["device_uuid"].startswith("MIG-")
    assert running["connection"]["env"]["CUDA_VISIBLE_DEVICES"] == running["connection"]["device_uuid"]
    ended = wait_until(lambda: (lambda x: x if x["state"] == "ended" else None)(lease(od_lease)),
                       timeout=15, what="the on-demand lease ended by its duration")
    # The duration counts from running: exactly 3 billed seconds at the slice's price.
    price = Decimal(ended["price_per_hour"])
    assert Decimal(ended["cost_charged"]) == (price * 3 / 3600).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)

    # Spot on the whole A100, then an on-demand order that queues for it: the spot lease gets its notice.
    status, bid = api(stack, key, "POST", "/bids/", {"gpu_models": ["a100-80gb"], "whole_gpu": True,
                                                     "max_price_per_hour": "600", "webhook_url": hook_url})
    assert status == 201, bid
    spot_lease = bid["order"]["leases"][0]
    wait_until(lambda: lease(spot_lease)["state"] == "running", timeout=15, what="the spot lease running")
    status, higher = api(stack, key, "POST", "/orders/", {"mode": "on_demand", "gpu_models": ["a100-80gb"],
                                                          "whole_gpu": True, "duration_seconds": 2,
                                                          "if_unavailable": "queue"})
    assert status == 202 and higher["state"] == "queued", higher
    notice = lease(spot_lease)["interruption"]
    assert notice["kind"] == "preempted" and notice["notice_seconds"] == 2
    wait_until(lambda: any(h.get("lease") == spot_lease and h["type"] == "interruption" for h in Hook.received),
               timeout=10, what="the interruption notice at the buyer's webhook")
    wait_until(lambda: lease(spot_lease)["state"] == "ended", timeout=15, what="the spot lease gone")
    higher_lease = wait_until(lambda: (lambda o: o["leases"][0] if o["leases"] else None if o["state"] == "queued"
                                       else pytest.fail(f"the queued order is {o['state']}: {o['explain']}"))(
        order(higher["id"])), timeout=15, what="the on-demand order placed on the freed GPU")
    wait_until(lambda: lease(higher_lease)["state"] == "ended", timeout=20, what="the on-demand lease over")
    assert lease(higher_lease)["started_at"] is not None

    # The reservation's lease was started by the beat and ended with its window.
    reserved = wait_until(lambda: [x for x in api(stack, key, "GET", "/leases/?mode=reserved")[1]["results"]
                                   if x["state"] == "ended"], timeout=20, what="the reserved lease over")
    assert reserved[0]["reservation"] == reservation_id and reserved[0]["started_at"] is not None
    # The lease may end at its window's end before the beat's next reservation pass marks the window done.
    wait_until(lambda: api(stack, key, "GET", f"/reservations/{reservation_id}/")[1]["state"] == "done", timeout=20,
               what="the reservation done")

    # The books balance, and the month's statement matches what the leases were charged, to the cent.
    books = shell(stack, BOOKS, "BOOKS")
    assert books["problems"] == []
    metered = [lease(i) for i in (od_lease, spot_lease, higher_lease)]
    usage = sum((Decimal(x["cost_charged"]) for x in metered), Decimal("0"))
    assert books["usage"][od_lease] == 3  # GPU-seconds on the statement: the 3 s it ran, no more
    assert set(books["usage"]) <= {x["id"] for x in metered}
    month = ended["started_at"][:7]
    status, st = api(stack, key, "GET", f"/statements/?month={month}")
    assert status == 200, st
    reservation_price = Decimal(booked["total_price"])
    assert Decimal(st["totals"]["usage_amount"]) == usage
    assert st["totals"]["usage_amount_usd"] == cents(usage)
    assert Decimal(st["totals"]["amount"]) == usage + reservation_price
    assert st["totals"]["amount_usd"] == cents(usage + reservation_price)
    wallet = api(stack, key, "GET", "/wallet/")[1]
    assert Decimal(wallet["balance"]) == Decimal("1000") - usage - reservation_price
    assert Decimal(st["wallet"]["closing_balance"]) == Decimal(wallet["balance"])
