"""The market's REST API end to end with simulated agents: every mode, permissions, bad input, queries."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.lifecycle import leases
from marketplace.models import Lease, LedgerTransaction, Order, ResaleListing, Reservation
from marketplace.money.check import ledger_check
from marketplace.products import spot
from scheduler.models import Node
from tests.factories import UserFactory, client_for
from tests.marketplace.marketsim import top_up, wallet

pytestmark = pytest.mark.django_db



def iso(dt) -> str:
    return dt.isoformat()


def test_an_on_demand_order_through_the_api_runs_is_metered_ends_and_the_statement_is_right_to_the_cent(fleet):
    node = fleet.node("h100-80gb:1", price="3.50")
    buyer = UserFactory()
    top_up(buyer, "20")
    c = client_for(buyer)
    r = c.post("/api/v1/orders/", {"mode": "on_demand", "gpu_models": ["h100-80gb"], "memory_gb": 20, "compute_slices": 2},
               format="json")
    assert r.status_code == 201, r.content
    lease_id = r.json()["leases"][0]
    assert c.get(f"/api/v1/leases/{lease_id}/").json()["connection"] is None  # not running yet
    fleet.play()
    detail = c.get(f"/api/v1/leases/{lease_id}/").json()
    assert detail["state"] == "running" and detail["profile"] == "2g.20gb"
    assert detail["connection"]["device_uuid"].startswith("MIG-")
    assert detail["connection"]["env"]["CUDA_VISIBLE_DEVICES"] == detail["connection"]["device_uuid"]
    assert detail["connection"]["node"] == str(node.pk)
    # 2g.20gb on H100-80GB: share max(2/7, 2/8) = 2/7; on demand 1.8 x 3.50 x 2/7 = 1.80/h
    assert detail["price_per_hour"] == "1.800000"
    start = Lease.objects.get(pk=lease_id).billed_until
    for s in range(5, 1800, 7):
        leases.meter_tick(now=start + timedelta(seconds=s))
    leases.lease_end(lease_id=lease_id, buyer=buyer, at=start + timedelta(seconds=1800, microseconds=900000))
    fleet.play()
    ended = c.get(f"/api/v1/leases/{lease_id}/").json()
    assert ended["state"] == "ended" and ended["cost_charged"] == "0.900000"  # 30 min at 1.80/h
    assert wallet(buyer) == Decimal("19.10") and ledger_check() == []
    charges = LedgerTransaction.objects.filter(lease_id=lease_id, kind="usage")
    assert -sum(e.amount for t in charges for e in t.entries.filter(account__kind="wallet")) == Decimal("0.90")
    from marketplace.money.statements import statement

    # Run at 23:40 on a month's last day, the half hour spans two months' statements: together they hold it.
    months = sorted({start.strftime("%Y-%m"), (start + timedelta(seconds=1800)).strftime("%Y-%m")})
    bodies = [statement(user=buyer, month=month)["totals"] for month in months]
    assert sum(b["gpu_seconds"] for b in bodies) == 1800
    assert sum(Decimal(b["usage_amount_usd"]) for b in bodies) == Decimal("0.90")


def test_a_spot_bid_through_the_api_is_interrupted_with_a_notice_and_billing_stops(fleet):
    fleet.node("l4:2", price="1.00")
    spotter, other = UserFactory(), UserFactory()
    top_up(spotter, "20"), top_up(other, "20")
    spot.spot_prices_recompute()
    r = client_for(spotter).post("/api/v1/bids/", {"max_price_per_hour": "0.60", "whole_gpu": True}, format="json")
    assert r.status_code == 201, r.content
    fleet.play()
    bid = client_for(spotter).get(f"/api/v1/bids/{r.json()['id']}/").json()
    assert bid["state"] == "won"
    client_for(other).post("/api/v1/orders/", {"mode": "on_demand"}, format="json")
    fleet.play()
    spot.spot_prices_recompute()  # free share 0: 70% of base 1.00 = 0.70 > 0.60
    lease = client_for(spotter).get("/api/v1/leases/?mode=spot").json()["results"][0]
    assert lease["state"] == "interrupting" and lease["interruption"]["kind"] == "price"
    assert lease["interruption"]["notice_seconds"] == 120
    prices = client_for(spotter).get("/api/v1/spot-prices/?gpu_model=l4").json()["results"]
    assert [p["factor"] for p in prices] == ["0.7000", "0.5000"]


def test_a_reservation_and_its_resale_through_the_api(fleet):
    fleet.node("l4:1", price="1.00")
    seller, buyer = UserFactory(), UserFactory()
    top_up(seller, "20"), top_up(buyer, "20")
    start = timezone.now() + timedelta(hours=3)
    r = client_for(seller).post("/api/v1/orders/", {"mode": "reserved", "window_start": iso(start),
                                                     "window_end": iso(start + timedelta(hours=4))}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["total_price"] == "3.400000"  # 0.85 x 1.00 x 4 h
    res_id = r.json()["reservations"][0]
    bad = client_for(seller).post(f"/api/v1/reservations/{res_id}/list-for-resale/",
                                  {"starts_at": iso(start), "ends_at": iso(start + timedelta(hours=1)),
                                   "ask_per_hour": "0.91"}, format="json")  # above 0.9 x base
    assert bad.status_code == 400 and "ask_per_hour" in bad.json()["error"]["fields"]
    listed = client_for(seller).post(f"/api/v1/reservations/{res_id}/list-for-resale/",
                                     {"starts_at": iso(start + timedelta(hours=2)),
                                      "ends_at": iso(start + timedelta(hours=4)), "ask_per_hour": "0.80"},
                                     format="json")
    assert listed.status_code == 201, listed.content
    public = APIClient().get("/api/v1/resale-listings/?gpu_model=l4").json()["results"]
    assert [x["id"] for x in public] == [listed.json()["id"]]
    assert APIClient().get("/api/v1/resale-listings/?gpu_model=a10").json()["results"] == []
    bought = client_for(buyer).post(f"/api/v1/resale-listings/{listed.json()['id']}/buy/", format="json")
    assert bought.status_code == 201, bought.content
    assert bought.json()["reservation"]["starts_at"] == iso(start + timedelta(hours=2)).replace("+00:00", "Z")
    assert wallet(buyer) == Decimal("18.40") and wallet(seller) == Decimal("16.60") + Decimal("1.44")
    again = client_for(UserFactory()).post(f"/api/v1/resale-listings/{listed.json()['id']}/buy/", format="json")
    assert again.status_code == 409
    mine = client_for(seller).get("/api/v1/reservations/").json()["results"]
    assert [(x["starts_at"], x["ends_at"]) for x in mine] == [
        (iso(start).replace("+00:00", "Z"), iso(start + timedelta(hours=2)).replace("+00:00", "Z"))]
    assert ledger_check() == []


def test_a_buyer_sees_and_touches_only_its_own_orders_leases_reservations_and_bids(fleet):
    fleet.node("l4:2")
    a, b = UserFactory(), UserFactory()
    top_up(a, "20"), top_up(b, "20")
    order = client_for(a).post("/api/v1/orders/", {"mode": "on_demand"}, format="json").json()
    lease_id = order["leases"][0]
    cb = client_for(b)
    assert cb.get("/api/v1/orders/").json()["results"] == []
    assert cb.get(f"/api/v1/orders/{order['id']}/").status_code == 404
    assert cb.get(f"/api/v1/leases/{lease_id}/").status_code == 404
    assert cb.post(f"/api/v1/leases/{lease_id}/end/", format="json").status_code == 404
    assert cb.post(f"/api/v1/orders/{order['id']}/cancel/", format="json").status_code == 404
    assert Lease.objects.get(pk=lease_id).state != Lease.State.ENDING
    assert APIClient().get("/api/v1/orders/").status_code in (401, 403)


@pytest.mark.parametrize("body, field", [
    ({"mode": "on_demand", "duration_seconds": 0}, "duration_seconds"),
    ({"mode": "on_demand", "duration_seconds": -60}, "duration_seconds"),
    ({"mode": "on_demand", "gpu_models": ["z100"]}, "gpu_models"),
    ({"mode": "spot", "max_price_per_hour": "5.00"}, "max_price_per_hour"),  # above on demand (1.80)
    ({"mode": "reserved", "window_start": "2001-01-01T00:00:00Z", "window_end": "2001-01-01T01:00:00Z"},
     "window_start"),
    ({"mode": "flat-rate"}, "mode"),
    ({"mode": "on_demand", "memory_gb": "lots"}, "memory_gb"),
    ({"mode": "on_demand", "webhook_url": "ftp://x"}, "webhook_url"),
])
def test_bad_orders_get_a_400_naming_the_field_and_write_nothing(fleet, body, field):
    fleet.node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "20")
    r = client_for(buyer).post("/api/v1/orders/", body, format="json")
    assert r.status_code == 400, r.content
    assert field in r.json()["error"]["fields"] and r.json()["error"]["message"]
    assert not Order.objects.exists() and not Lease.objects.exists()


def test_malformed_json_and_wrong_content_types_are_refused(fleet):
    c = client_for(UserFactory())
    r = c.post("/api/v1/orders/", data="{not json", content_type="application/json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "parse_error"
    r = c.post("/api/v1/orders/", data="mode=on_demand", content_type="application/x-www-form-urlencoded")
    assert r.status_code == 415
    assert not Order.objects.exists()


def test_an_unplaceable_order_is_a_409_with_reasons_or_a_queued_202(fleet):
    fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "20")
    c = client_for(buyer)
    r = c.post("/api/v1/orders/", {"mode": "on_demand", "memory_gb": 48}, format="json")
    assert r.status_code == 409 and r.json()["error"]["code"] == "unavailable"
    assert r.json()["error"]["details"]["reasons"]
    r = c.post("/api/v1/orders/", {"mode": "on_demand", "memory_gb": 48, "if_unavailable": "queue"}, format="json")
    assert r.status_code == 202 and r.json()["state"] == "queued" and r.json()["explain"]
    assert c.post(f"/api/v1/orders/{r.json()['id']}/cancel/", format="json").json()["state"] == "cancelled"


def test_an_empty_wallet_gets_a_402(fleet):
    fleet.node("l4:1")
    r = client_for(UserFactory()).post("/api/v1/orders/", {"mode": "on_demand"}, format="json")
    assert r.status_code == 402 and r.json()["error"]["code"] == "insufficient_funds"


def _offers(**params) -> list[dict]:
    r = APIClient().get("/api/v1/offers/", params)
    assert r.status_code == 200, r.content
    return r.json()["results"]


@pytest.fixture
def catalog(fleet):
    fleet.node("h100-80gb:1", region="eu-west", price="3.00", cuda="12.4")
    fleet.node("a100-40gb:1", region="us-east", price="1.20", cuda="12.2")
    fleet.node("l4:2", region="eu-central", price="0.50", cuda="12.8")
    Node.objects.filter(region="us-east").update(reliability=0.9)
    return fleet


def test_offers_list_each_unit_with_availability_pu_prices_and_history(catalog):
    offers = {o["id"]: o for o in _offers()}
    l4 = offers["l4:whole:eu-central"]
    assert l4["availability"] == 2 and l4["gpus"] == 2 and l4["pu"] > 0
    assert l4["prices"]["on_demand"] == "0.900000" and l4["prices"]["reserved"] == "0.425000"
    assert l4["prices"]["spot"] == "0.250000" and "resale" not in l4["prices"]  # 0.5 x base: below reserved
    assert l4["interruptions"] == {"last_30_days": 0, "recent": []}
    assert offers["h100-80gb:1g.10gb:eu-west"]["availability"] == 7
    assert offers["h100-80gb:3g.40gb:eu-west"]["availability"] == 2


@pytest.mark.parametrize("params, expect", [
    ({"gpu_model": "l4"}, lambda o: o["gpu_model"] == "l4"),
    ({"min_memory_gb": 40}, lambda o: o["memory_gb"] >= 40),
    ({"min_cuda": "12.4"}, lambda o: o["region"] != "us-east"),
    ({"min_compute_capability": "8.9"}, lambda o: o["gpu_model"] in ("h100-80gb", "l4")),
    ({"region": "us-east"}, lambda o: o["region"] == "us-east"),
    ({"max_price": "0.5"}, lambda o: Decimal(o["prices"]["on_demand"]) <= Decimal("0.5")),
    ({"min_reliability": 0.95}, lambda o: o["gpu_model"] != "a100-40gb"),
    ({"mode": "spot", "max_price": "0.3"}, lambda o: Decimal(o["prices"]["spot"]) <= Decimal("0.3")),
    ({"min_pu_per_dollar": 4}, lambda o: o["pu_per_dollar"] >= 4),
])
def test_each_offer_filter_really_filters(catalog, params, expect):
    everything = _offers()
    kept = _offers(**params)
    assert kept and len(kept) < len(everything)
    assert all(expect(o) for o in kept)
    assert all(expect(o) is False for o in everything if o["id"] not in {k["id"] for k in kept})


def test_offers_sort_and_resale_mode_lists_only_units_with_listings(catalog):
    prices = [Decimal(o["prices"]["on_demand"]) for o in _offers(ordering="price")]
    assert prices == sorted(prices)
    ppd = [o["pu_per_dollar"] for o in _offers(ordering="-pu_per_dollar")]
    assert ppd == sorted(ppd, reverse=True)
    assert _offers(mode="resale") == []
    bad = APIClient().get("/api/v1/offers/", {"gpu_model": "z100"})
    assert bad.status_code == 400 and "gpu_model" in bad.json()["error"]["fields"]


def test_list_endpoints_use_a_fixed_number_of_queries(fleet):
    fleet.node("l4:8", price="0.10")
    buyer = UserFactory()
    top_up(buyer, "50")
    c = client_for(buyer)

    def count(url):
        with CaptureQueriesContext(connection) as q:
            assert c.get(url).status_code == 200
        return len(q)

    c.post("/api/v1/orders/", {"mode": "on_demand"}, format="json")
    c.post("/api/v1/bids/", {"max_price_per_hour": "0.15"}, format="json")
    fleet.play()
    before = {u: count(u) for u in ("/api/v1/orders/", "/api/v1/leases/", "/api/v1/bids/", "/api/v1/reservations/",
                                    "/api/v1/resale-listings/", "/api/v1/spot-prices/")}
    for _ in range(3):
        c.post("/api/v1/orders/", {"mode": "on_demand"}, format="json")
        c.post("/api/v1/bids/", {"max_price_per_hour": "0.15"}, format="json")
    fleet.play()
    after = {u: count(u) for u in before}
    assert after == before and max(after.values()) <= 8


def test_an_order_names_one_of_the_buyers_projects_and_its_usage_and_charges_land_on_that_project(fleet):
    fleet.node("l4:1", price="3.60")  # on demand 6.48/h
    buyer, stranger = UserFactory(), UserFactory()
    top_up(buyer, "20")
    c = client_for(buyer)
    mine = c.post("/api/v1/projects/", {"name": "vision"}, format="json").json()["id"]
    theirs = client_for(stranger).post("/api/v1/projects/", {"name": "secret"}, format="json").json()["id"]
    # Someone else's project id in the body is refused like a missing one, and nothing is written.
    for bad in (theirs, 10**9):
        r = c.post("/api/v1/orders/", {"mode": "on_demand", "project": bad}, format="json")
        assert r.status_code == 404 and "project" in r.json()["error"]["fields"], r.content
    assert not Order.objects.exists() and not Lease.objects.exists()
    r = c.post("/api/v1/orders/", {"mode": "on_demand", "project": mine}, format="json")
    assert r.status_code == 201 and r.json()["project"] == mine
    fleet.play()
    lease = Lease.objects.get(pk=r.json()["leases"][0])
    t0 = lease.billed_until
    leases.meter_tick(now=t0 + timedelta(seconds=600))
    leases.lease_end(lease_id=lease.pk, buyer=buyer, at=t0 + timedelta(seconds=600))
    charges = LedgerTransaction.objects.filter(lease_id=lease.pk, kind="usage")
    assert charges and {t.project_id for t in charges} == {mine}
    months = sorted({t0.strftime("%Y-%m"), (t0 + timedelta(seconds=600)).strftime("%Y-%m")})  # a month's end
    bodies = [c.get("/api/v1/statements/", {"month": month, "project": mine}).json() for month in months]
    assert sum(b["totals"]["gpu_seconds"] for b in bodies) == 600
    assert sum(Decimal(b["totals"]["usage_amount_usd"]) for b in bodies) == Decimal("1.08")
    assert {b["projects"][0]["project"]["name"] for b in bodies} == {"vision"}


def test_a_reservation_booked_for_a_project_is_charged_to_it(fleet):
    fleet.node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "20")
    c = client_for(buyer)
    mine = c.post("/api/v1/projects/", {"name": "training"}, format="json").json()["id"]
    start = timezone.now() + timedelta(hours=2)
    r = c.post("/api/v1/orders/", {"mode": "reserved", "window_start": iso(start), "project": mine,
                                   "window_end": iso(start + timedelta(hours=1))}, format="json")
    assert r.status_code == 201, r.content
    assert LedgerTransaction.objects.get(order_id=r.json()["id"], kind="reservation").project_id == mine


@pytest.fixture
def writes(fleet):
    """A buyer with something behind every write endpoint: a running lease, a queued order, a reservation
    listed for resale (by another seller), a project and a succeeded top-up."""
    from marketplace.models import Payment, Project
    from marketplace.products import orders
    from marketplace.products import resale
    from marketplace.products.orders import OrderSpec

    fleet.node("l4:3", price="1.00")
    buyer, seller = UserFactory(), UserFactory()
    top_up(buyer, "50"), top_up(seller, "50")
    lease_order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True))
    fleet.play()
    start = timezone.now() + timedelta(hours=3)
    orders.order_place(buyer=buyer, spec=OrderSpec(mode="reserved", window_start=start,
                                                   window_end=start + timedelta(hours=2)))
    orders.order_place(buyer=seller, spec=OrderSpec(mode="reserved", window_start=start,
                                                    window_end=start + timedelta(hours=2)))
    listing = resale.listing_create(seller=seller, reservation_id=Reservation.objects.get(holder=seller).pk,
                                    starts_at=start, ends_at=start + timedelta(hours=1), ask_per_hour=Decimal("0.5"))
    project = Project.objects.create(user=buyer, name="p")
    payment = Payment.objects.create(user=buyer, stripe_payment_intent_id="pi_x", amount=Decimal("10"),
                                     status=Payment.Status.SUCCEEDED)
    return {"buyer": buyer, "lease": Lease.objects.get(order=lease_order).pk, "order": lease_order.pk,
            "reservation": Reservation.objects.get(holder=buyer).pk, "listing": listing.pk,
            "project": project.pk, "payment": payment.pk}


@pytest.mark.parametrize("method, path, body", [
    ("post", "/api/v1/orders/", "mode=on_demand&whole_gpu=true"),
    ("post", "/api/v1/bids/", "max_price_per_hour=1.00"),
    ("post", "/api/v1/orders/{order}/cancel/", "x=1"),
    ("post", "/api/v1/leases/{lease}/end/", "x=1"),
    ("post", "/api/v1/reservations/{reservation}/list-for-resale/", "ask_per_hour=0.1"),
    ("post", "/api/v1/resale-listings/{listing}/buy/", "x=1"),
    ("post", "/api/v1/topups/", "amount=25.00"),
    ("post", "/api/v1/payments/{payment}/refund/", "amount=1.00"),
    ("post", "/api/v1/projects/", "name=q"),
    ("patch", "/api/v1/projects/{project}/", "name=renamed"),
    ("delete", "/api/v1/projects/{project}/", "x=1"),
])
def test_every_api_write_refuses_a_form_encoded_body_with_a_415_in_the_one_error_shape_and_writes_nothing(
        writes, method, path, body):
    from marketplace.models import LedgerEntry, Payment, Project

    def state():
        return (list(Order.objects.values_list("id", "state")), list(Lease.objects.values_list("id", "state")),
                list(Reservation.objects.values_list("id", "state", "holder")),
                list(ResaleListing.objects.values_list("id", "state")), list(Project.objects.values_list("id", "name")),
                list(Payment.objects.values_list("id", "status", "refunded_amount")), LedgerEntry.objects.count())

    before = state()
    r = getattr(client_for(writes["buyer"]), method)(path.format(**writes), data=body,
                                                     content_type="application/x-www-form-urlencoded")
    assert r.status_code == 415, r.content
    assert r.json()["error"]["code"] == "unsupported_media_type" and "JSON" in r.json()["error"]["message"]
    assert state() == before


def test_a_write_without_a_body_still_works(writes):
    r = client_for(writes["buyer"]).post(f"/api/v1/leases/{writes['lease']}/end/")
    assert r.status_code == 200 and r.json()["state"] in ("ending", "ended")
