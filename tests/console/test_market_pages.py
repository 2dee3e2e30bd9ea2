"""Console pages of the market, with the Django test client (no JavaScript): every page renders and its
forms submit without a script; bad input gets a message beside its field and keeps what was typed; a
page shows only its user's data; list pages make a fixed number of queries however many rows they show."""
from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from marketplace.lifecycle import leases
from marketplace.models import ApiKey, Lease, NotificationSettings, Order, Project, ResaleListing, Reservation
from marketplace.products import apikeys, orders, resale
from marketplace.products.orders import OrderSpec
from tests.factories import UserFactory
from tests.marketplace.marketsim import top_up, wallet

pytestmark = pytest.mark.django_db


def queries(client, url) -> tuple:
    with CaptureQueriesContext(connection) as ctx:
        r = client.get(url)
    assert r.status_code == 200, r.content[:2000]
    return r, len(ctx.captured_queries)


def on_demand(fleet, buyer, **spec):
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=10, duration_seconds=3600,
                                                           **spec))
    fleet.play()
    return Lease.objects.get(order=order)


def reserve(buyer, *, hours_ahead=2, hours=2):
    now = timezone.now()
    order = orders.order_place(buyer=buyer, spec=OrderSpec(
        mode="reserved", memory_gb=10, window_start=now + timedelta(hours=hours_ahead),
        window_end=now + timedelta(hours=hours_ahead + hours)))
    return Reservation.objects.get(order=order)


# --- catalog and unit --------------------------------------------------------------------------------------

def test_the_catalog_lists_units_with_prices_per_mode_pu_price_and_availability_for_visitors_too(client, fleet):
    fleet.node("h100-80gb:1", price="2.00", region="eu-west")
    fleet.node("l4:1", price="0.50", region="us-east")
    r = client.get("/catalog/")
    html = r.content.decode()
    assert r.status_code == 200
    assert 'data-unit="h100-80gb:3g.40gb:eu-west"' in html and 'data-unit="l4:whole:us-east"' in html
    # on demand = 1.8 x base x share: L4 whole = 0.90/h
    row = re.search(r'data-unit="l4:whole:us-east".*?</tr>', html, re.S).group(0)
    assert "$0.900" in row and "Log in to order" in row
    r = client.get("/catalog/", {"gpu_model": "l4", "ordering": "-pu_per_dollar"})
    assert 'data-unit="l4:whole:us-east"' in r.content.decode()
    assert "h100-80gb" not in r.content.decode().split("<tbody>")[1]


def test_bad_catalog_filters_show_a_message_beside_the_field_and_keep_the_input(client, fleet):
    fleet.node("l4:1")
    r = client.get("/catalog/", {"min_cuda": "twelve", "region": "eu-west"})
    html = r.content.decode()
    assert r.status_code == 400
    assert 'id="id_min_cuda_error"' in html and "a version like 12.2" in html
    assert 'value="twelve"' in html and 'value="eu-west"' in html and 'aria-invalid="true"' in html


def test_a_units_page_draws_its_spot_price_history_as_its_changes_over_the_period_recorded(client, fleet):
    from marketplace.models import SpotPrice
    from marketplace.products import spot

    fleet.node("a100-80gb:1")
    now = timezone.now()
    for i in range(3):
        spot.spot_prices_recompute(now=now - timedelta(minutes=3 - i))
    r = client.get("/catalog/a100-80gb:3g.40gb:eu-west/")
    assert r.status_code == 200
    html = r.content.decode()
    series = json.loads(re.search(r'<script id="spot-series" type="application/json">(.*?)</script>', html).group(1))
    # the pool is all free: 0.5 x base 2.00 x half a GPU = 0.50/h; three equal points are one step, drawn until now
    assert series["price"] == [0.5, 0.5] and 'data-points="0"' in html
    assert series["span"] == [series["t"][0], series["t"][-1]] and series["t"][-1] >= int(now.timestamp())
    # three minutes recorded: the title says since when, not "last 48 hours"
    assert "Spot price, since" in html and "last 48 hours" not in html

    # Two days of prices every 30 s (5,760 points, more than any fixed cut): each change is drawn, the oldest too.
    SpotPrice.objects.all().delete()
    start = now - timedelta(hours=47, minutes=59)
    SpotPrice.objects.bulk_create([
        SpotPrice(gpu_model="a100-80gb", at=start + timedelta(seconds=30 * i), free_share=1.0,
                  factor=Decimal("0.6") if 100 <= i < 200 else Decimal("0.5"), price_per_gpu_hour=Decimal("1"))
        for i in range(5750)])
    html = client.get("/catalog/a100-80gb:3g.40gb:eu-west/").content.decode()
    series = json.loads(re.search(r'<script id="spot-series" type="application/json">(.*?)</script>', html).group(1))
    assert series["price"] == [0.5, 0.6, 0.5, 0.5] and series["t"][0] == int(start.timestamp())
    assert "Spot price, last 48 hours" in html and 'data-points="2"' in html
    assert client.get("/catalog/a100-80gb:9g.1gb:eu-west/").status_code == 404


def test_the_catalog_makes_a_fixed_number_of_queries_however_many_nodes(client, fleet):
    # (The selector reads each model's spot factor once: the count follows models, not nodes or GPUs.)
    fleet.node("a100-80gb:1"), fleet.node("h100-80gb:1")
    _, few = queries(client, "/catalog/")
    for _ in range(12):
        fleet.node("h100-80gb:2"), fleet.node("a100-80gb:2")
    r, many = queries(client, "/catalog/")
    assert "h100-80gb" in r.content.decode() and many == few


# --- order --------------------------------------------------------------------------------------------------

def test_ordering_on_demand_without_javascript_opens_a_lease_and_shows_its_page(client, fleet, buyer):
    fleet.node("h100-80gb:1")
    top_up(buyer, "50")
    r = client.post("/order/", {"mode": "on_demand", "gpu_model": "h100-80gb", "memory_gb": "10",
                                "compute_slices": "1", "duration_hours": "1", "if_unavailable": "fail"})
    lease = Lease.objects.get(buyer=buyer)
    assert r.status_code == 302 and r["Location"] == f"/leases/{lease.pk}/"
    fleet.play()
    html = client.get(r["Location"]).content.decode()
    lease.refresh_from_db()
    assert lease.state == "running"
    assert f"CUDA_VISIBLE_DEVICES={lease.slice.instance_uuid}" in html and lease.slice.instance_uuid.startswith("MIG-")
    assert 'id="end-lease"' in html
    r = client.post(f"/leases/{lease.pk}/end/")
    assert r.status_code == 302
    lease.refresh_from_db()
    assert lease.state in ("ending", "ended")


def test_a_bad_order_shows_each_error_beside_its_field_and_keeps_what_was_typed(client, fleet, buyer):
    fleet.node("h100-80gb:1")
    r = client.post("/order/", {"mode": "spot", "gpu_model": "h100-80gb", "memory_gb": "-3", "region": "mars-1",
                                "duration_hours": "", "if_unavailable": "fail", "webhook_url": "not a url"})
    html = r.content.decode()
    assert r.status_code == 400
    assert 'id="id_memory_gb_error"' in html and "greater than or equal to 0" in html
    assert 'id="id_duration_hours_error"' in html and 'id="id_max_price_per_hour_error"' in html
    assert 'id="id_webhook_url_error"' in html and 'value="not a url"' in html
    assert 'value="-3"' in html and 'value="mars-1"' in html
    assert re.search(r'value="spot"[^>]* checked', html)
    assert Order.objects.count() == 0


def test_an_order_the_wallet_cannot_cover_says_so_and_claims_nothing(client, fleet, buyer):
    fleet.node("h100-80gb:1")
    r = client.post("/order/", {"mode": "on_demand", "gpu_model": "h100-80gb", "memory_gb": "10",
                                "compute_slices": "1", "duration_hours": "2", "if_unavailable": "fail"})
    html = r.content.decode()
    assert r.status_code == 400 and "Not enough money in the wallet" in html
    assert 'value="2"' in html or 'value="2.00"' in html
    assert Lease.objects.count() == 0


def test_the_price_preview_gives_total_per_hour_and_per_pu_hour(client, fleet, buyer):
    fleet.node("a100-80gb:1", price="2.00")
    r = client.get("/order/preview/", {"mode": "on_demand", "gpu_model": "a100-80gb", "memory_gb": "40",
                                       "compute_slices": "3", "duration_hours": "2"}, HTTP_HX_REQUEST="true")
    html = r.content.decode()
    # 3g.40gb costs half an A100: 1.8 x 2.00 x 0.5 = 1.80/h; 2 h = 3.60
    assert re.search(r'id="quote-per-hour">\$1\.8000<', html) and re.search(r'id="quote-total">\$3\.60<', html)
    assert re.search(r'id="quote-per-pu-hour">\$\d+\.\d{4}<', html) and "<html" not in html
    later = timezone.now() + timedelta(hours=3)
    r = client.get("/order/preview/", {"mode": "reserved", "gpu_model": "a100-80gb", "memory_gb": "40",
                                       "compute_slices": "3", "window_start": later.strftime("%Y-%m-%dT%H:00"),
                                       "window_end": (later + timedelta(hours=2)).strftime("%Y-%m-%dT%H:00")})
    html = r.content.decode()
    # booked ahead: 0.85 x 2.00 x 0.5 = 0.85/h, and the calendar of free hours is there
    assert re.search(r'id="quote-per-hour">\$0\.8500<', html) and 'class="calendar"' in html and "slot free" in html


def test_a_reserved_order_without_a_window_yet_shows_the_units_price_and_its_calendar_of_free_hours(client, fleet, buyer):
    fleet.node("h100-80gb:1", price="2.00")
    html = client.get("/order/?mode=reserved&gpu_model=h100-80gb&memory_gb=20&compute_slices=2").content.decode()
    # 2g.20gb is two sevenths of an H100 booked ahead: 0.85 x 2.00 x 2/7 = 0.4857/h; no window, no total
    assert re.search(r'id="quote-per-hour">\$0\.4857<', html) and 'id="calendar"' in html and "slot free" in html
    assert re.search(r'id="quote-total">—<', html)


def test_the_calendar_shows_a_booked_window_as_taken(client, fleet, buyer):
    fleet.node("a100-80gb:1", price="2.00")
    top_up(buyer, "100")
    now = timezone.now()
    start = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=3)
    orders.order_place(buyer=buyer, spec=OrderSpec(mode="reserved", whole_gpu=True, window_start=start,
                                                   window_end=start + timedelta(hours=1)))
    r = client.get("/order/preview/", {"mode": "reserved", "gpu_model": "a100-80gb", "whole_gpu": "on",
                                       "window_start": (start + timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M"),
                                       "window_end": (start + timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M")})
    html = r.content.decode()
    taken = re.findall(r'data-start="([^"]+)"[^>]*disabled aria-pressed="false" aria-label="[^"]*busy"', html)
    assert taken == [start.strftime("%Y-%m-%d %H:%M")]
    # the window asked for (typed as the browser's picker once sent it, with a T) is drawn as chosen by the server
    chosen = re.findall(r'class="slot free chosen" data-start="([^"]+)"', html)
    assert chosen == [(start + timedelta(hours=5)).strftime("%Y-%m-%d %H:%M")]


# --- leases ---------------------------------------------------------------------------------------------------

def test_my_leases_shows_only_mine_in_a_fixed_number_of_queries(client, fleet, buyer):
    fleet.node("h100-80gb:8")
    other = UserFactory()
    top_up(other, "100")
    top_up(buyer, "500")
    theirs = on_demand(fleet, other)
    on_demand(fleet, buyer)
    r, few = queries(client, "/leases/")
    assert str(theirs.pk)[:8] not in r.content.decode()
    for _ in range(12):
        on_demand(fleet, buyer)
    r, many = queries(client, "/leases/")
    assert r.content.decode().count("data-lease=") == 13 and many == few
    assert client.get(f"/leases/{theirs.pk}/").status_code == 404
    assert client.post(f"/leases/{theirs.pk}/end/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.state == "running"


def test_a_lease_page_shows_an_interruption_notice_with_its_deadline(client, fleet, buyer, settings):

    fleet.node("h100-80gb:1")
    top_up(buyer, "100")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="spot", memory_gb=10, duration_seconds=3600,
                                                           max_price_per_hour=Decimal("0.5")))
    fleet.play()
    lease = Lease.objects.get(order=order)
    leases.lease_interrupt(lease_id=lease.pk, kind="price", now=timezone.now())
    html = client.get(f"/leases/{lease.pk}/").content.decode()
    assert 'id="interruption-notice"' in html and 'class="countdown"' in html and 'role="alert"' in html


# --- reservations and resale -------------------------------------------------------------------------------------

def test_listing_part_of_a_reservation_shows_the_cap_and_refuses_an_ask_above_it_beside_the_field(client, fleet, buyer):
    fleet.node("a100-80gb:1", price="2.00")
    top_up(buyer, "100")
    r = reserve(buyer)
    html = client.get("/reservations/").content.decode()
    cap = resale.resale_cap(reservation=r)
    assert f"${cap:.4f}" in html
    start = (r.starts_at + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M")
    end = (r.starts_at + timedelta(minutes=90)).strftime("%Y-%m-%dT%H:%M")
    p = str(r.pk)
    resp = client.post(f"/reservations/{r.pk}/list/", {f"{p}-starts_at": start, f"{p}-ends_at": end,
                                                       f"{p}-ask_per_hour": "999"})
    html = resp.content.decode()
    assert resp.status_code == 400 and f'id="id_{p}-ask_per_hour_error"' in html and "at most" in html
    assert 'value="999"' in html and ResaleListing.objects.count() == 0
    resp = client.post(f"/reservations/{r.pk}/list/", {f"{p}-starts_at": start, f"{p}-ends_at": end,
                                                       f"{p}-ask_per_hour": "0.25"})
    assert resp.status_code == 302 and ResaleListing.objects.get().seller == buyer


def test_a_second_user_buys_a_listing_in_one_step_from_the_public_market(client, fleet):
    fleet.node("a100-80gb:1", price="2.00")
    seller, bob = UserFactory(), UserFactory(username="bob")
    top_up(seller, "100"), top_up(bob, "100")
    r = reserve(seller)
    listing = resale.listing_create(seller=seller, reservation_id=r.pk, starts_at=r.starts_at + timedelta(minutes=30),
                                    ends_at=r.starts_at + timedelta(minutes=90), ask_per_hour=Decimal("0.25"))
    html = client.get("/resale/").content.decode()  # public
    assert f'data-listing="{listing.pk}"' in html and "Log in to buy" in html
    client.force_login(bob)
    resp = client.post(f"/resale/{listing.pk}/buy/")
    assert resp.status_code == 302 and resp["Location"] == "/reservations/"
    assert Reservation.objects.filter(holder=bob).count() == 1
    assert wallet(bob) == Decimal("100") - listing.price_total
    assert "Bought" in client.get("/reservations/").content.decode()


def test_reservations_and_resale_pages_make_a_fixed_number_of_queries(client, fleet, buyer):
    fleet.node("a100-80gb:4", price="2.00")
    seller = UserFactory()
    top_up(buyer, "500"), top_up(seller, "500")

    def list_one(hours_ahead):
        r = reserve(seller, hours_ahead=hours_ahead, hours=1)
        resale.listing_create(seller=seller, reservation_id=r.pk, starts_at=r.starts_at, ends_at=r.ends_at,
                              ask_per_hour=Decimal("0.25"))
    reserve(buyer), list_one(2)
    _, few_res = queries(client, "/reservations/")
    _, few_sale = queries(client, "/resale/")
    for h in range(3, 12):
        reserve(buyer, hours_ahead=h, hours=1), list_one(h)
    r, many_res = queries(client, "/reservations/")
    assert r.content.decode().count("data-reservation=") == 10 and many_res == few_res
    r, many_sale = queries(client, "/resale/")
    assert r.content.decode().count("data-listing=") == 10 and many_sale == few_sale


# --- billing ---------------------------------------------------------------------------------------------------

def test_billing_shows_the_balance_ledger_statement_and_spending_in_a_fixed_number_of_queries(client, fleet, buyer):
    fleet.node("h100-80gb:8")
    top_up(buyer, "200")
    lease = on_demand(fleet, buyer)
    leases.meter_tick(now=lease.started_at + timedelta(seconds=90))
    r, few = queries(client, "/billing/")
    html = r.content.decode()
    assert 'id="balance"' in html and "usage" in html and 'id="spend-by-model"' in html and "H100-80GB" in html
    for _ in range(10):
        top_up(buyer, "1")
    r, many = queries(client, "/billing/")
    assert many == few
    csv = client.get("/billing/statement.csv")
    assert csv.status_code == 200 and csv["Content-Type"] == "text/csv"
    assert csv.content.decode().splitlines()[0].startswith("month,project,item")
    assert "h100-80gb" in csv.content.decode()
    r = client.get("/billing/", {"kind": "topup"})
    assert "usage" not in r.content.decode().split('id="ledger"')[1].split("</table>")[0].replace("usage-", "")


def test_a_bad_top_up_amount_is_refused_beside_the_field(client, buyer):
    r = client.post("/billing/topup/", {"amount": "0.10"})
    assert r.status_code == 400 and "amount" in r.json()["errors"]


# --- account ---------------------------------------------------------------------------------------------------

def test_an_api_key_is_shown_once_listed_by_prefix_and_revoked(client, buyer):
    r = client.post("/account/keys/", {"name": "ci", "scopes": ["read", "trade"]})
    secret = re.search(r'id="new-api-key">([^<]+)<', r.content.decode()).group(1)
    assert apikeys.api_key_resolve(secret=secret).user == buyer
    html = client.get("/account/").content.decode()
    assert secret not in html and secret[:16] in html
    key = ApiKey.objects.get(user=buyer)
    client.post(f"/account/keys/{key.pk}/revoke/")
    assert apikeys.api_key_resolve(secret=secret) is None
    other = UserFactory()
    theirs, their_secret = apikeys.api_key_create(user=other, name="theirs")
    client.post(f"/account/keys/{theirs.pk}/revoke/")
    assert apikeys.api_key_resolve(secret=their_secret).user == other
    assert "theirs" not in client.get("/account/").content.decode()


def test_a_bad_key_or_project_name_is_refused_beside_the_field_and_kept(client, buyer):
    r = client.post("/account/keys/", {"name": ""})
    assert r.status_code == 400 and 'id="id_name_error"' in r.content.decode()
    client.post("/account/projects/", {"project-name": "vision"})
    r = client.post("/account/projects/", {"project-name": "vision", "project-description": "again"})
    html = r.content.decode()
    assert r.status_code == 400 and "already have a project named" in html and 'value="again"' in html
    assert Project.objects.filter(user=buyer).count() == 1


# --- provider -----------------------------------------------------------------------------------------------------

def test_a_provider_cordons_and_uncordons_a_gpu_and_drains_a_node_but_not_someone_elses(client, fleet):
    prov = UserFactory(username="pam")
    client.force_login(prov)
    node = fleet.node("a100-80gb:1", provider=prov)
    gpu = node.gpus.get()
    r = client.post(f"/nodes/{node.pk}/gpus/{gpu.pk}/health/", {"action": "cordon"})
    assert r.status_code == 302
    gpu.refresh_from_db()
    assert gpu.health == "cordoned"
    r = client.post(f"/nodes/{node.pk}/gpus/{gpu.pk}/health/", {"action": "uncordon"}, HTTP_HX_REQUEST="true")
    gpu.refresh_from_db()
    assert gpu.health == "healthy" and 'hx-swap-oob="true"' in r.content.decode()
    client.post(f"/nodes/{node.pk}/drain/", {"action": "drain"})
    node.refresh_from_db()
    assert node.status == "draining"
    other = fleet.node("l4:1")
    their_gpu = other.gpus.get()
    assert client.post(f"/nodes/{other.pk}/gpus/{their_gpu.pk}/health/", {"action": "cordon"}).status_code == 404
    assert client.post(f"/nodes/{other.pk}/drain/").status_code == 404
    assert client.post(f"/nodes/{node.pk}/gpus/{their_gpu.pk}/health/", {"action": "cordon"}).status_code == 404
    their_gpu.refresh_from_db(), other.refresh_from_db()
    assert their_gpu.health == "healthy" and other.status == "online"


def test_a_provider_sees_earnings_over_time_from_metered_usage(client, fleet):

    prov = UserFactory(username="earner")
    fleet.node("h100-80gb:1", provider=prov)
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = on_demand(fleet, buyer)
    # Ten minutes, or what is left of this month (the chart's last bar is the current month).
    month_end = (lease.started_at.replace(day=28) + timedelta(days=4)).replace(day=1, hour=0, minute=0, second=0,
                                                                                microsecond=0)
    leases.meter_tick(now=min(lease.started_at + timedelta(seconds=600), month_end - timedelta(seconds=1)))
    client.force_login(prov)
    html = client.get("/nodes/").content.decode()
    month = timezone.now().strftime("%Y-%m")
    assert 'id="earnings-chart"' in html and month in html
    bar = re.search(rf'{month}</span>.*?<span class="num">\$([0-9.]+)</span>', html, re.S).group(1)
    assert Decimal(bar) > 0  # 10 min of 0.5143/h less the 10% fee


def test_operators_revoke_keys_and_withdraw_listings_from_the_admin(client, fleet):
    staff = UserFactory(username="op", is_staff=True, is_superuser=True)
    user = UserFactory()
    key, secret = apikeys.api_key_create(user=user, name="k")
    client.force_login(staff)
    r = client.post("/admin/marketplace/apikey/", {"action": "revoke", "_selected_action": [str(key.pk)]})
    assert r.status_code == 302 and apikeys.api_key_resolve(secret=secret) is None
    fleet.node("a100-80gb:1", price="2.00")
    top_up(user, "100")
    res = reserve(user)
    listing = resale.listing_create(seller=user, reservation_id=res.pk, starts_at=res.starts_at,
                                    ends_at=res.ends_at, ask_per_hour=Decimal("0.25"))
    client.post("/admin/marketplace/resalelisting/", {"action": "withdraw", "_selected_action": [str(listing.pk)]})
    listing.refresh_from_db()
    assert listing.state == "cancelled"


# --- projects on the order form, notification settings on the account page --------------------------------

def test_the_order_form_offers_the_buyers_own_projects_and_the_order_lands_on_the_chosen_one(client, fleet, buyer):
    fleet.node("h100-80gb:1")
    top_up(buyer, "50")
    mine = Project.objects.create(user=buyer, name="vision")
    theirs = Project.objects.create(user=UserFactory(), name="secret-project")
    html = client.get("/order/").content.decode()
    assert 'name="project"' in html and f'value="{mine.pk}">vision' in html and "secret-project" not in html
    r = client.post("/order/", {"mode": "on_demand", "gpu_model": "h100-80gb", "memory_gb": "10",
                                "compute_slices": "1", "duration_hours": "1", "if_unavailable": "fail",
                                "project": str(mine.pk)})
    assert r.status_code == 302 and Order.objects.get(buyer=buyer).project == mine
    r = client.post("/order/", {"mode": "on_demand", "gpu_model": "h100-80gb", "memory_gb": "10",
                                "compute_slices": "1", "duration_hours": "1", "if_unavailable": "fail",
                                "project": str(theirs.pk)})
    assert r.status_code == 400 and 'id="id_project_error"' in r.content.decode()
    assert Order.objects.filter(buyer=buyer).count() == 1


def test_notification_settings_are_saved_on_the_account_page(client, buyer):
    r = client.post("/account/notifications/", {"notify-webhook_url": "https://hooks.example.org/gpu",
                                                "notify-interruption": "on", "notify-lease_failed": "on"})
    assert r.status_code == 302
    row = buyer.notification_settings
    assert (row.webhook_url, row.interruption, row.lease_ended, row.lease_failed, row.balance_low) == (
        "https://hooks.example.org/gpu", True, False, True, False)
    html = client.get("/account/").content.decode()
    assert 'value="https://hooks.example.org/gpu"' in html


@pytest.mark.parametrize("loopback_allowed, url, ok", [
    (False, "http://127.0.0.1:8000/hook", False),
    (True, "http://127.0.0.1:8000/hook", True),
    (True, "http://10.0.0.1/hook", False),
    (False, "ftp://example.org/hook", False),
])
def test_a_webhook_url_to_this_machine_or_a_private_network_gets_an_error_beside_the_field_and_keeps_the_input(
        client, buyer, settings, loopback_allowed, url, ok):
    settings.WEBHOOKS_ALLOW_LOOPBACK = loopback_allowed
    r = client.post("/account/notifications/", {"notify-webhook_url": url, "notify-interruption": "on"})
    if ok:
        assert r.status_code == 302 and buyer.notification_settings.webhook_url == url
        return
    html = r.content.decode()
    assert r.status_code == 400 and 'id="id_notify-webhook_url_error"' in html and f'value="{url}"' in html
    assert not NotificationSettings.objects.exists()


def test_the_order_form_takes_a_number_of_gpus_and_opens_one_lease_per_gpu(client, fleet, buyer):
    fleet.node("l4:2", price="1.00")
    top_up(buyer, "50")
    assert 'name="gpu_count"' in client.get("/order/").content.decode()
    r = client.post("/order/", {"mode": "on_demand", "gpu_model": "l4", "memory_gb": "10", "compute_slices": "1",
                                "gpu_count": "2", "duration_hours": "1", "if_unavailable": "fail"})
    assert r.status_code == 302, r.content.decode()[:2000]
    order = Order.objects.get(buyer=buyer)
    assert order.gpu_count == 2 and order.leases.count() == 2


def test_a_bad_number_of_gpus_shows_its_error_beside_the_field_and_writes_nothing(client, fleet, buyer):
    fleet.node("l4:2", price="1.00")
    top_up(buyer, "50")
    r = client.post("/order/", {"mode": "on_demand", "gpu_model": "l4", "memory_gb": "10", "compute_slices": "1",
                                "gpu_count": "9", "duration_hours": "1", "if_unavailable": "fail"})
    assert r.status_code == 400 and 'id="id_gpu_count_error"' in r.content.decode()
    start = timezone.now() + timedelta(hours=3)
    r = client.post("/order/", {"mode": "reserved", "gpu_model": "l4", "memory_gb": "10", "compute_slices": "1",
                                "gpu_count": "2", "window_start": start.strftime("%Y-%m-%dT%H:%M"),
                                "window_end": (start + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"),
                                "if_unavailable": "fail"})
    assert r.status_code == 400 and 'id="id_gpu_count_error"' in r.content.decode()
    assert not Order.objects.exists() and not Lease.objects.exists()
