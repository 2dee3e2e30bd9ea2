"""k whole GPUs on one node per order (gpu_count): k leases claimed together, metered and ended each on its own."""
from __future__ import annotations

from datetime import timedelta

import pytest

from marketplace.lifecycle import leases
from marketplace.models import Lease, Order
from marketplace.money.check import ledger_check
from scheduler.models import Slice
from tests.factories import UserFactory, client_for
from tests.marketplace.marketsim import top_up

pytestmark = pytest.mark.django_db



def test_a_two_gpu_on_demand_order_runs_two_metered_leases_on_one_node_and_ending_the_order_ends_both(fleet):
    fleet.node("l4:1", price="1.00")
    node = fleet.node("l4:2", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "50")
    c = client_for(buyer)
    r = c.post("/api/v1/orders/", {"mode": "on_demand", "gpu_count": 2, "duration_seconds": 3600}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["gpu_count"] == 2 and body["whole_gpu"] is True and len(body["leases"]) == 2
    fleet.play()
    details = [c.get(f"/api/v1/leases/{lease_id}/").json() for lease_id in body["leases"]]
    assert all(d["state"] == "running" and d["profile"] == "whole" for d in details)
    assert {d["connection"]["node"] for d in details} == {str(node.pk)}
    assert len({d["connection"]["gpu_uuid"] for d in details}) == 2
    assert len({d["connection"]["device_uuid"] for d in details}) == 2
    # L4 on demand: 1.8 x 1.00 per GPU; the order's price is both GPUs'.
    assert [d["price_per_hour"] for d in details] == ["1.800000", "1.800000"]
    assert body["price_per_hour"] == "3.600000"
    start = max(Lease.objects.get(pk=lid).billed_until for lid in body["leases"])
    for s in range(5, 600, 7):
        leases.meter_tick(now=start + timedelta(seconds=s))
    assert all(lease.cost_charged > 0 for lease in Lease.objects.filter(pk__in=body["leases"]))
    r = c.post(f"/api/v1/orders/{body['id']}/cancel/", format="json")
    assert r.status_code == 200, r.content
    fleet.play()
    assert set(Lease.objects.filter(pk__in=body["leases"]).values_list("state", flat=True)) == {"ended"}
    assert not Slice.objects.filter(state__in=Slice.ACTIVE_STATES).exists()
    assert ledger_check() == []


def test_a_spot_order_for_two_gpus_gets_two_leases_on_one_node(fleet):
    from marketplace.products import spot

    node = fleet.node("l4:2", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "50")
    spot.spot_prices_recompute()
    r = client_for(buyer).post("/api/v1/orders/", {"mode": "spot", "gpu_count": 2, "max_price_per_hour": "3.00",
                                                   "duration_seconds": 3600}, format="json")
    assert r.status_code == 201, r.content
    leases = Lease.objects.filter(order_id=r.json()["id"])
    assert leases.count() == 2 and {lease.slice.gpu.node_id for lease in leases} == {node.pk}


def test_a_four_gpu_order_when_no_node_has_four_free_gpus_is_refused_with_reasons_or_queued(fleet):
    fleet.node("l4:2", price="1.00")
    fleet.node("l4:2", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "50")
    c = client_for(buyer)
    r = c.post("/api/v1/orders/", {"mode": "on_demand", "gpu_count": 4}, format="json")
    assert r.status_code == 409, r.content
    assert r.json()["error"]["code"] == "unavailable" and r.json()["error"]["details"]["reasons"]
    assert not Lease.objects.exists() and not Slice.objects.exists()
    r = c.post("/api/v1/orders/", {"mode": "on_demand", "gpu_count": 4, "if_unavailable": "queue"}, format="json")
    assert r.status_code == 202 and r.json()["state"] == "queued" and r.json()["explain"] and r.json()["reasons"]
    assert not Lease.objects.exists() and not Slice.objects.exists()


def test_a_wallet_that_covers_one_gpu_but_not_two_is_refused_and_nothing_is_claimed(fleet):
    fleet.node("l4:2", price="100.00")
    buyer = UserFactory()
    top_up(buyer, "3")  # 15 min of one GPU at 180/h is 45 USD: not even one; both is 90
    r = client_for(buyer).post("/api/v1/orders/", {"mode": "on_demand", "gpu_count": 2}, format="json")
    assert r.status_code == 402, r.content
    assert "2 GPUs" in r.json()["error"]["message"]
    assert not Order.objects.exists() and not Lease.objects.exists() and not Slice.objects.exists()


@pytest.mark.parametrize("body", [
    {"mode": "on_demand", "gpu_count": 0},
    {"mode": "on_demand", "gpu_count": 9},
    {"mode": "on_demand", "gpu_count": "two"},
    {"mode": "on_demand", "gpu_count": 2, "compute_slices": 3},
    {"mode": "on_demand", "gpu_count": 2, "whole_gpu": False},
])
def test_bad_gpu_count_inputs_get_a_400_on_the_field_and_write_nothing(fleet, body):
    fleet.node("l4:2", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "20")
    r = client_for(buyer).post("/api/v1/orders/", body, format="json")
    assert r.status_code == 400, r.content
    assert "gpu_count" in r.json()["error"]["fields"]
    assert not Order.objects.exists() and not Lease.objects.exists() and not Slice.objects.exists()


def test_a_reserved_order_for_two_gpus_is_refused_on_the_gpu_count_field(fleet):
    from django.utils import timezone

    fleet.node("l4:2", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "200")
    start = timezone.now() + timedelta(hours=3)
    r = client_for(buyer).post("/api/v1/orders/", {
        "mode": "reserved", "gpu_count": 2, "window_start": start.isoformat(),
        "window_end": (start + timedelta(hours=1)).isoformat()}, format="json")
    assert r.status_code == 400, r.content
    assert "gpu_count" in r.json()["error"]["fields"]
    assert not Order.objects.exists() and not Lease.objects.exists()


def test_when_one_of_the_gpus_fails_to_provision_the_others_end_and_are_refunded(fleet):
    fleet.node("h100-80gb:2", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "50")
    r = client_for(buyer).post("/api/v1/orders/", {"mode": "on_demand", "gpu_count": 2}, format="json")
    assert r.status_code == 201, r.content
    fleet.play(fail_creates=True)
    leases = list(Lease.objects.filter(order_id=r.json()["id"]))
    assert len(leases) == 2 and all(lease.state in ("failed", "ended") for lease in leases)
    assert Order.objects.get(pk=r.json()["id"]).state == "failed"
    assert not Slice.objects.filter(state__in=Slice.ACTIVE_STATES).exists()
    from tests.marketplace.marketsim import wallet

    assert wallet(buyer) == 50 and ledger_check() == []


def test_a_two_gpu_spot_bid_covers_both_gpus_so_a_price_rise_past_it_interrupts_them(fleet):
    # The bid is for the k GPUs together (as the engine and the bid cap compare it): 1.20/h buys two L4s at
    # 0.50 each when the pool is free; once they fill it, spot goes to 0.70 each, 1.40 > 1.20 for the pair.
    from marketplace.products import spot

    fleet.node("l4:2", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "50")
    spot.spot_prices_recompute()
    r = client_for(buyer).post("/api/v1/orders/", {"mode": "spot", "gpu_count": 2, "max_price_per_hour": "1.20",
                                                   "duration_seconds": 3600}, format="json")
    assert r.status_code == 201, r.content
    fleet.play()
    spot.spot_prices_recompute()
    assert set(Lease.objects.filter(order_id=r.json()["id"]).values_list("state", flat=True)) == {"interrupting"}
