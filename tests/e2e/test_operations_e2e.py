"""Autoscaling and idle reclaim end to end: the real ASGI server, Celery worker and beat, and a real
`python -m nodeagent --simulate l4:4` process whose load the test drives through its --load-file. The group
scales out when busy, holds for its cooldown, scales back in when idle; an idle lease of another buyer gets its
notice (at its webhook) and is reclaimed; every lease's charge and both wallets are right to the cent, from the
leases' seconds × price."""
from __future__ import annotations

from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

import pytest

from tests.e2e.livestack import LiveStack, wait_until, webhook_receiver

pytestmark = [pytest.mark.e2e]

PRICE = r"""
from decimal import Decimal
from scheduler.models import Node
Node.objects.update(price_per_gpu_hour=Decimal("360.00"))  # dear, so seconds of use are worth whole cents
"""

BOOKS = r"""
import json
from marketplace.money.check import ledger_check
print("BOOKS" + json.dumps({"problems": ledger_check()}))
"""

SCALE_OUT_COOLDOWN = 40  # seconds
SCALE_IN_COOLDOWN = 10


@pytest.fixture
def hook():
    with webhook_receiver() as (url, received):
        yield url, received


@pytest.fixture
def load(tmp_path):
    """The simulated machine's load file: the test writes a share (0..1) and the agent follows."""
    path = tmp_path / "load"
    path.write_text("0")

    def set_load(share: float) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(share))
        tmp.replace(path)  # whole, never half-written

    return set_load, path


@pytest.fixture
def stack(tmp_path, load):
    s = LiveStack(tmp_path, nodes=[("e2e-l4", "l4:4")], agent_interval=0.5,
                  agent_args=("--load-file", str(load[1])), env={
                      "MARKET_METER_SECONDS": "0.5", "MARKET_LEASE_TICK_SECONDS": "0.5", "MARKET_QUEUE_SECONDS": "0.5",
                      "MARKET_OPERATIONS_SECONDS": "1"})
    with s.running():
        yield s


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def charge(lease: dict) -> Decimal:
    """docs/market.md: its price per hour for every whole second from its start (truncated to the second) to its
    end, rounded half-up to the micro-dollar once."""
    start = at(lease["started_at"]).replace(microsecond=0)
    seconds = int((at(lease["ended_at"]) - start).total_seconds())
    return (Decimal(lease["price_per_hour"]) * seconds / 3600).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)


def test_a_group_scales_out_when_busy_respects_its_cooldown_scales_in_when_idle_and_an_idle_lease_is_reclaimed(
        stack, load, hook):
    set_load, _ = load
    hook_url, received = hook
    stack.shell(PRICE)
    team, night = stack.add_buyers(["ops-team", "ops-night"], credit="1000")
    wait_until(lambda: stack.api("GET", "/api/v1/offers/", key=team["api_key"])[1].get("results"), timeout=20,
               what="the L4s in the catalog")

    def api(buyer, method, path, body=None):
        return stack.api(method, "/api/v1" + path, body, key=buyer["api_key"])

    # Another buyer's lease under an idle reclaim policy: all day, idle below 20% for a minute, no grace.
    status, policy = api(night, "POST", "/reclaim-policies/", {
        "idle_below_pct": 20, "idle_minutes": 1, "hours_start": "00:00", "hours_end": "00:00", "grace_minutes": 0})
    assert status == 201, policy
    status, order = api(night, "POST", "/orders/", {"mode": "on_demand", "gpu_models": ["l4"], "whole_gpu": True,
                                                     "duration_seconds": 3600, "webhook_url": hook_url})
    assert status == 201, order
    night_lease = order["leases"][0]

    # The team's group: an inference server on whole L4s, 1 to 3 of them.
    status, project = api(team, "POST", "/projects/", {"name": "inference"})
    assert status == 201, project
    status, rule = api(team, "POST", "/autoscale-rules/", {
        "project": project["id"], "name": "vllm", "template": "vllm", "gpu_models": ["l4"], "whole_gpu": True,
        "min_leases": 1, "max_leases": 3, "scale_out_pct": 60, "scale_out_minutes": 1, "scale_in_pct": 20,
        "scale_in_minutes": 1, "scale_out_cooldown_seconds": SCALE_OUT_COOLDOWN,
        "scale_in_cooldown_seconds": SCALE_IN_COOLDOWN})
    assert status == 201, rule

    def actions(kind=None) -> list[dict]:
        found = api(team, "GET", "/autoscale-actions/?limit=100")[1]["results"][::-1]  # oldest first
        return [a for a in found if kind is None or a["kind"] == kind]

    def group() -> list[str]:
        return api(team, "GET", f"/autoscale-rules/{rule['id']}/")[1]["leases"]

    def lease(buyer, lease_id) -> dict:
        return api(buyer, "GET", f"/leases/{lease_id}/")[1]

    # The minimum: one lease, placed by an ordinary order of the team's project.
    first = wait_until(lambda: actions("scale_out"), timeout=20, what="the group's first lease")[0]
    assert "below the minimum of 1" in first["reason"]
    assert api(team, "GET", f"/orders/{first['order']}/")[1]["project"] == project["id"]
    wait_until(lambda: lease(night, night_lease)["state"] == "running", timeout=20, what="the night lease running")

    # Busy: the group grows to 2, then to 3 no sooner than the cooldown allows, and no further (the maximum).
    set_load(0.9)
    wait_until(lambda: len(actions("scale_out")) >= 3, timeout=240, what="two scale-outs while busy")
    outs = actions("scale_out")
    assert "above 60% for 1 min" in outs[1]["reason"] and outs[1]["leases_before"] == 1
    assert at(outs[2]["at"]) - at(outs[1]["at"]) >= timedelta(seconds=SCALE_OUT_COOLDOWN)
    assert outs[2]["leases_before"] == 2
    # Busy, the night lease has no notice.
    assert api(night, "GET", "/reclaim-notices/")[1]["count"] == 0
    wait_until(lambda: len(group()) == 3 and all(lease(team, x)["state"] == "running" for x in group()),
               timeout=30, what="three leases running")

    # Idle: back in to the minimum, one lease at a time, the cooldown between; the night lease is reclaimed.
    set_load(0.0)
    wait_until(lambda: len(actions("scale_in")) >= 2, timeout=240, what="two scale-ins while idle")
    ins = actions("scale_in")
    assert all("below 20% for 1 min" in a["reason"] for a in ins)
    assert at(ins[1]["at"]) - at(ins[0]["at"]) >= timedelta(seconds=SCALE_IN_COOLDOWN)
    assert [a["leases_before"] for a in ins] == [3, 2]
    wait_until(lambda: len(group()) == 1, timeout=30, what="the group at its minimum")
    assert len(actions("scale_out")) == 3  # it never went past the maximum
    wait_until(lambda: lease(night, night_lease)["state"] == "ended", timeout=120, what="the night lease reclaimed")
    notices = api(night, "GET", "/reclaim-notices/")[1]["results"]
    reclaimed = [n for n in notices if n["state"] == "reclaimed"]
    assert len(reclaimed) == 1 and reclaimed[0]["lease"] == night_lease
    wait_until(lambda: any(h.get("type") == "reclaim_notice" and h["lease"] == night_lease for h in received),
               timeout=10, what="the notice at the order's webhook")
    ended_night = lease(night, night_lease)
    assert ended_night["end_reason"] == "idle reclaim"
    # Saved: the rest of its hour at its price, from when it was reclaimed.
    rest = (at(ended_night["ends_at"]) - at(reclaimed[0]["acted_at"])).total_seconds()
    assert Decimal(reclaimed[0]["saved"]) == (Decimal(ended_night["price_per_hour"]) * Decimal(str(rest)) / 3600
                                             ).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)

    # The last lease of the group is ended by the team; then the money, to the cent.
    last = group()[0]
    assert api(team, "POST", f"/leases/{last}/end/")[0] == 200
    team_leases = [a["lease"] for a in ins] + [last]
    wait_until(lambda: all(lease(team, x)["state"] == "ended" for x in team_leases), timeout=30,
               what="the group's leases ended")
    assert {lease(team, x)["order"] for x in team_leases} == {a["order"] for a in outs}
    for buyer, ids in ((team, team_leases), (night, [night_lease])):
        spent = Decimal("0")
        for lease_id in ids:
            done = lease(buyer, lease_id)
            assert Decimal(done["cost_charged"]) == charge(done), done
            spent += charge(done)
        wallet = api(buyer, "GET", "/wallet/")[1]
        assert Decimal(wallet["balance"]) == Decimal("1000") - spent
    assert stack.shell(BOOKS, "BOOKS")["problems"] == []
