"""A provider's earnings: the month per lease or reserved window, per node and in total add up exactly and equal the
month's earnings ledger (reservation income included, refunds taken off, payouts left out); and nothing a provider
can see names a buyer's order or project."""
from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.db.models import Sum

from marketplace.models import LedgerEntry, LedgerTransaction, Order, Reservation
from marketplace.money import movements
from marketplace.money.earnings import earnings, monthly_net
from marketplace.products import orders, payouts, resale
from marketplace.products.orders import OrderSpec
from marketplace.products.projects import project_create
from scheduler.models import Node
from tests.factories import UserFactory, client_for
from tests.marketplace.marketsim import Fleet, top_up
from tests.marketplace.payoutfix import dated, provider_user
from tests.marketplace.test_statements import at, run_lease

pytestmark = pytest.mark.django_db

OCTOBER = at("2026-10-20T12:00")



@pytest.fixture
def month(settings):
    """October 2026 of a provider with an H100 and an L4 node: two metered leases of one buyer (one partly refunded),
    a reserved window of another buyer on the L4 (paid when booked), a paid payout; a lease that ended on 1 October
    after starting on 30 September; a lease of November."""
    settings.PAYOUT_TRANSFERS = "simulated"
    settings.PAYOUT_MINIMUM = D("1.00")
    settings.PAYOUT_HOLD_DAYS = 0.0
    fleet = Fleet()
    provider = provider_user("gpu-host")
    h100 = fleet.node("h100-80gb:1", price="4.00", provider=provider)
    Node.objects.filter(pk=h100.pk).update(name="rack-h100")
    l4 = fleet.node("l4:1", price="1.00", provider=provider)
    Node.objects.filter(pk=l4.pk).update(name="rack-l4")
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    top_up(alice, "100"), top_up(bob, "100")
    secret = project_create(user=alice, name="secret-train-7f3a")
    bobs = project_create(user=bob, name="bob-private-eval")
    run_lease(fleet, alice, project=secret, model="h100-80gb", memory_gb=40, start=at("2026-09-30T23:59"),
              ticks=[at("2026-10-01T00:00:00.5")], end=at("2026-10-01T00:01"))  # 60 s in September, 60 s in October
    run_lease(fleet, alice, project=secret, model="h100-80gb", memory_gb=40, start=at("2026-10-05T10:00"),
              ticks=[at("2026-10-05T10:01:00.5")], end=at("2026-10-05T10:03"))  # 180 s, 0.18
    run_lease(fleet, alice, project=secret, model="h100-80gb", memory_gb=10, start=at("2026-11-02T10:00"),
              ticks=[], end=at("2026-11-02T10:01"))
    # 20% of the 10:00-10:01 minute refunded (say, the node fell silent): taken back out of earnings.
    usage = LedgerTransaction.objects.get(kind="usage", memo__contains="10:00:00–10:01:00",
                                          created_at=at("2026-10-05T10:00"))
    dated(movements.refund(original=usage, idempotency_key="partial", amount=D("0.012")), at("2026-10-06T08:00"))
    # Bob books 3 hours of the L4 ahead: 3 x 0.85 = 2.55, paid when booked (on 10 October).
    start = at("2026-10-25T10:00")
    booked = orders.order_place(buyer=bob, now=at("2026-10-10T09:00"), spec=OrderSpec(
        mode="reserved", gpu_models=["l4"], whole_gpu=True, window_start=start, window_end=start + timedelta(hours=3),
        project_id=bobs.pk))
    window = booked.reservations.get()
    dated(LedgerTransaction.objects.get(idempotency_key=f"reservation:{window.pk}"), at("2026-10-10T09:00"))
    p = payouts.payout_request(provider=provider, amount=D("1.00"))
    payouts.payout_approve(payout_id=p.pk, by=UserFactory(is_staff=True))
    for txn in LedgerTransaction.objects.filter(kind__startswith="payout"):
        dated(txn, at("2026-10-28T12:00"))
    return {"provider": provider, "h100": h100, "l4": l4, "buyers": [alice, bob], "window": window,
            "projects": [secret, bobs]}


def earned_in_october(provider) -> D:
    """The month's earnings ledger, payouts left out: what every view must add up to."""
    return (LedgerEntry.objects.filter(account__user=provider, account__kind="earnings",
                                       created_at__gte=at("2026-10-01T00:00"), created_at__lt=at("2026-11-01T00:00"))
            .exclude(transaction__kind__in=movements.PAYOUT_KINDS).aggregate(s=Sum("amount"))["s"])


def test_the_month_total_equals_the_node_table_and_the_lease_rows_with_reservation_income(month):
    body = client_for(month["provider"]).get("/api/v1/earnings/", {"month": "2026-10"}).json()
    net = D(body["totals"]["net"])
    assert net == earned_in_october(month["provider"])
    assert net == sum(D(n["net"]) for n in body["nodes"]) == sum(D(i["net"]) for i in body["leases"])
    assert D(body["totals"]["gross"]) == sum(D(n["gross"]) for n in body["nodes"])
    assert D(body["totals"]["fee"]) == sum(D(i["fee"]) for i in body["leases"])
    # The hand-computed month. H100 3g.40gb: 3.60/h on demand, 0.06 a minute. October: 0.06 (the lease from
    # September) + 0.18 - 0.012 refunded = 0.228 gross, fee 10% of each charge: 0.006 + 0.018 - 0.0012 = 0.0228.
    # L4 window: 3 h x 0.85 = 2.55 gross, 0.255 fee.
    nodes = {n["node"]["name"]: n for n in body["nodes"]}
    assert (nodes["rack-h100"]["gross"], nodes["rack-h100"]["fee"], nodes["rack-h100"]["net"]) == (
        "0.228000", "0.022800", "0.205200")
    assert (nodes["rack-l4"]["gross"], nodes["rack-l4"]["fee"], nodes["rack-l4"]["net"]) == (
        "2.550000", "0.255000", "2.295000")
    assert nodes["rack-l4"]["gpu_seconds"] == 3 * 3600 and nodes["rack-h100"]["gpu_seconds"] == 60 + 180
    assert body["totals"] == {"gpu_seconds": 3 * 3600 + 240, "gross": "2.778000", "fee": "0.277800",
                              "net": "2.500200", "net_usd": "2.50"}
    # Payouts are not earnings, but the ledger by kind shows them.
    assert body["ledger"] == {"payout": "-1.000000", "reservation": "2.295000", "reversal": "-0.010800",
                              "usage": "0.216000"}


def test_each_lease_and_window_is_a_row_with_its_node_gpu_period_and_money(month):
    body = earnings(user=month["provider"], month="2026-10")
    rows = body["leases"]
    assert [(r["kind"], r["mode"], r["node"]["name"], r["gpu_model"], r["profile"]) for r in rows] == [
        ("reservation", "reserved", "rack-l4", "l4", "whole"),
        ("lease", "on_demand", "rack-h100", "h100-80gb", "3g.40gb"),
        ("lease", "on_demand", "rack-h100", "h100-80gb", "3g.40gb")]  # newest period first
    window, refunded, september = rows
    assert window["reservation"] == str(month["window"].pk) and window["lease"] is None
    assert (window["period_start"], window["period_end"]) == (at("2026-10-25T10:00"), at("2026-10-25T13:00"))
    assert (refunded["gross"], refunded["fee"], refunded["net"], refunded["gpu_seconds"]) == (
        "0.168000", "0.016800", "0.151200", 180)
    assert (september["gross"], september["gpu_seconds"]) == ("0.060000", 60)
    assert september["period_start"] == at("2026-09-30T23:59") and september["period_end"] == at("2026-10-01T00:01")
    assert all(D(r["gross"]) - D(r["fee"]) == D(r["net"]) for r in rows)


def test_the_months_chart_leaves_payouts_out(month):
    from datetime import date

    bars = {m["month"]: m["net"] for m in monthly_net(user=month["provider"], today=date(2026, 11, 15))}
    assert list(bars)[-2:] == ["2026-10", "2026-11"]
    assert bars["2026-10"] == D("2.500200") == earned_in_october(month["provider"])
    assert bars["2026-09"] == D("0.054000") and bars["2026-11"] > 0


def test_the_nodes_and_earnings_pages_show_totals_that_equal_the_node_table(client, month):
    client.force_login(month["provider"])
    html = client.get("/earnings/", {"month": "2026-10"}).content.decode()
    assert re.search(r'id="earnings-month-net"><strong>\$2\.50<', html)
    table = re.search(r'id="earnings-by-node">(.*?)</table>', html, re.S).group(1)
    assert "rack-l4" in table and "$2.30" in table and "$0.21" in table
    assert "reserved window" in html and "3g.40gb" in html


# --- no buyer's order or project where a provider looks -------------------------------------------------------------

def _json_values(value, key=None):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_values(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _json_values(v, key)
    else:
        yield key, value


def assert_no_buyer_ids(text: str, *, order_ids: set, projects: list) -> None:
    for order_id in order_ids:
        assert order_id not in text and order_id.replace("-", "") not in text, order_id
    for project in projects:
        assert project.name not in text, project.name
    try:
        body = json.loads(text)
    except ValueError:
        return
    for key, value in _json_values(body):
        if key and "project" in key:
            assert value not in {p.pk for p in projects}, (key, value)


def test_a_providers_pages_and_api_never_name_a_buyers_order_or_project(client, month):
    provider = month["provider"]
    order_ids = {str(pk) for pk in Order.objects.values_list("pk", flat=True)}
    assert len(order_ids) == 4
    api = client_for(provider)
    for url in ("/api/v1/earnings/?month=2026-10", "/api/v1/earnings/?month=2026-11", "/api/v1/ledger-entries/",
                "/api/v1/ledger-entries/?account=earnings", "/api/v1/wallet/", "/api/v1/payouts/",
                "/api/v1/payouts/balance/", "/api/v1/usage/", "/api/v1/nodes/", "/api/v1/slices/", "/api/v1/gpus/",
                "/api/v1/statements/?month=2026-10"):
        r = api.get(url)
        assert r.status_code == 200, (url, r.content[:300])
        assert_no_buyer_ids(r.content.decode(), order_ids=order_ids, projects=month["projects"])
    client.force_login(provider)
    for url in ("/nodes/", f"/nodes/{month['h100'].pk}/", f"/nodes/{month['l4'].pk}/", "/earnings/?month=2026-10",
                "/earnings/?month=2026-11", "/billing/"):
        r = client.get(url)
        assert r.status_code == 200, url
        assert_no_buyer_ids(r.content.decode(), order_ids=order_ids, projects=month["projects"])
    # The earnings lines do sit in the buyers' transactions (that is how they leaked): the ids are hidden, not absent.
    assert LedgerTransaction.objects.filter(kind="usage", order_id__in=order_ids).exists()


def test_a_buyer_still_sees_its_own_orders_on_its_ledger(month):
    alice = month["buyers"][0]
    entries = client_for(alice).get("/api/v1/ledger-entries/", {"kind": "usage"}).json()["results"]
    own = {str(pk) for pk in Order.objects.filter(buyer=alice).values_list("pk", flat=True)}
    assert entries and {e["transaction"]["order_id"] for e in entries} <= own
    assert all(e["transaction"]["order_id"] for e in entries)
    assert {e["project"] for e in entries} == {month["projects"][0].pk}


def test_a_resale_seller_sees_neither_the_buyers_order_nor_its_project(client, settings):
    Fleet().node("l4:1", price="1.00")
    seller, buyer = UserFactory(username="seller"), UserFactory(username="resale-buyer")
    top_up(seller, "100"), top_up(buyer, "100")
    start = at("2030-01-01T10:00")
    orders.order_place(buyer=seller, spec=OrderSpec(mode="reserved", window_start=start,
                                                    window_end=start + timedelta(hours=3)))
    listing = resale.listing_create(seller=seller, reservation_id=Reservation.objects.get(holder=seller).pk,
                                    starts_at=start + timedelta(hours=1), ends_at=start + timedelta(hours=2),
                                    ask_per_hour=D("0.90"))
    hidden = project_create(user=buyer, name="acquisition-plans")
    bought = resale.listing_purchase(buyer=buyer, listing_id=listing.pk, project=hidden).order
    proceeds = client_for(seller).get("/api/v1/ledger-entries/", {"kind": "resale"}).json()["results"]
    assert len(proceeds) == 1 and proceeds[0]["transaction"]["order_id"] is None and proceeds[0]["project"] is None
    paid = client_for(buyer).get("/api/v1/ledger-entries/", {"kind": "resale"}).json()["results"]
    assert paid[0]["transaction"]["order_id"] == str(bought.pk) and paid[0]["project"] == hidden.pk
    client.force_login(seller)
    html = client.get("/billing/").content.decode()
    assert "resale" in html and "acquisition-plans" not in html and str(bought.pk) not in html
