"""The market core: the bugs found through the API (fixed), metering that posts once a minute in a constant
number of statements, the shared snapshot of read paths, the periodic ledger check and the fleet port."""
from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from marketplace import metering
from marketplace.claims import snapshot
from marketplace.lifecycle import leases
from marketplace.models import (
    Account,
    Lease,
    LedgerCheck,
    LedgerTransaction,
    Order,
    UsageRecord,
)
from marketplace.money import ledger
from marketplace.money.check import ledger_check, ledger_check_run
from marketplace.products import catalog, orders, resale
from marketplace.products.orders import OrderSpec
from marketplace.products.projects import project_create
from scheduler import ports
from tests.factories import UserFactory, client_for
from tests.marketplace.marketsim import Fleet, top_up, wallet

pytestmark = pytest.mark.django_db



# --- the four bugs found through the API ---------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    {"mode": "on_demand", "memory_gb": 10, "compute_slices": 1, "gpu_count": 2},  # a slice with a count
    {"mode": "on_demand", "gpu_count": 2, "whole_gpu": False},
])
def test_a_slice_order_with_a_gpu_count_is_a_400_not_k_whole_gpus_at_many_times_its_price(body):
    Fleet().node("a100-80gb:4", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    r = client_for(buyer).post("/api/v1/orders/", body, format="json")
    assert r.status_code == 400 and "gpu_count" in r.json()["error"]["fields"]
    assert not Order.objects.exists() and wallet(buyer) == D("100")
    whole = client_for(buyer).post("/api/v1/orders/", {"mode": "on_demand", "gpu_count": 2, "memory_gb": 40},
                                   format="json")
    assert whole.status_code == 201, whole.content  # whole GPUs with at least 40 GB each: what k means


def test_resale_proceeds_are_booked_under_the_sellers_project_and_the_purchase_under_the_buyers():
    Fleet().node("l4:1", price="1.00")
    seller, buyer = UserFactory(), UserFactory()
    top_up(seller, "10"), top_up(buyer, "10")
    serving, research = project_create(user=seller, name="serving"), project_create(user=buyer, name="research")
    start = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    orders.order_place(buyer=seller, spec=OrderSpec(mode="reserved", window_start=start,
                                                    window_end=start + timedelta(hours=2), project_id=serving.pk))
    r = seller.reservations.get()
    listing = resale.listing_create(seller=seller, reservation_id=r.pk, starts_at=start + timedelta(hours=1),
                                    ends_at=start + timedelta(hours=2), ask_per_hour=D("0.80"))
    orders.order_place(buyer=buyer, spec=OrderSpec(mode="resale", listing_id=listing.pk, project_id=research.pk))
    month = timezone.now().strftime("%Y-%m")
    mine = client_for(seller).get("/api/v1/statements/", {"month": month, "project": serving.pk}).json()
    # the booking (1.70) less the resale's proceeds (0.80 less the 10% fee: 0.72), both under "serving"
    assert {c["kind"]: c["amount"] for c in mine["projects"][0]["other_charges"]} == {
        "reservation": "1.700000", "resale": "-0.720000"}
    theirs = client_for(buyer).get("/api/v1/statements/", {"month": month, "project": research.pk}).json()
    assert theirs["projects"][0]["other_charges"] == [{"kind": "resale", "label": "resale market", "amount": "0.800000",
                                                       "amount_usd": "0.80"}]
    assert ledger_check() == []


def test_a_two_minute_reservation_is_charged_to_the_micro_dollar_not_rounded_up_to_a_cent():
    Fleet().node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "10")
    start = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="reserved", window_start=start,
                                                           window_end=start + timedelta(minutes=2)))
    # 0.85/h for 120 s = 0.028333 (rounding to the cent made it 0.03, 5.9% more)
    assert order.total_price == D("0.028333") and wallet(buyer) == D("9.971667")


def test_spot_is_the_cheapest_way_in_on_every_unit_and_a_resale_ask_is_capped_at_nine_tenths_of_base():
    fleet = Fleet()
    fleet.node("h100-80gb:2", price="3.00"), fleet.node("l4:2", price="0.60", region="us-east")
    offers = catalog.offer_list(filters=catalog.Filters())
    assert len(offers) > 5
    for o in offers:
        assert o.prices["spot"] < o.prices["reserved"] < o.prices["on_demand"], o.key
    buyer = UserFactory()
    top_up(buyer, "10")
    start = timezone.now() + timedelta(hours=2)
    orders.order_place(buyer=buyer, spec=OrderSpec(mode="reserved", gpu_models=["l4"], window_start=start,
                                                   window_end=start + timedelta(hours=1)))
    r = buyer.reservations.get()
    assert resale.resale_cap(reservation=r) == D("0.540000")  # 0.9 x 0.60: never the on-demand price
    assert r.price_total < D("0.540000") * 1 < D("1.080000")  # bought at 0.51, resold at most at 0.54


# --- metering --------------------------------------------------------------------------------------------------

def _running(fleet: Fleet, n: int, *, t0) -> list[Lease]:
    out = []
    for _ in range(n):
        buyer = UserFactory()
        top_up(buyer, "100")
        order = orders.order_place(buyer=buyer, now=t0, spec=OrderSpec(mode="on_demand", whole_gpu=True))
        out.append(order.leases.get())
    Lease.objects.filter(pk__in=[x.pk for x in out]).update(started_at=t0, accrued_until=t0, billed_until=t0)
    return out


def _statements(fn) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        fn()
    return [q["sql"] for q in ctx.captured_queries]


def test_a_tick_with_no_minute_due_writes_nothing_and_reads_in_a_constant_number_of_queries():
    fleet = Fleet()
    fleet.node("l4:8", price="1.00")
    t0 = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=5)
    _running(fleet, 2, t0=t0)
    few = _statements(lambda: leases.meter_tick(now=t0 + timedelta(seconds=30)))
    _running(fleet, 6, t0=t0)
    many = _statements(lambda: leases.meter_tick(now=t0 + timedelta(seconds=35)))
    # the running leases per buyer; the hard-capped projects among them (budgets; none here); a minute due?
    assert len(many) == len(few) <= 3
    assert not [q for q in many if q.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]


def test_posting_a_minute_takes_the_same_statements_for_3_leases_as_for_12():
    counts = []
    for n in (3, 12):
        fleet = Fleet()
        node = fleet.node(f"l4:{n}", price="1.00")
        ledger.account_for(user=node.provider, kind="earnings"), ledger.platform_account("platform_fees")
        t0 = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=10 * n)
        running = _running(fleet, n, t0=t0)
        sql = _statements(lambda: leases.meter_tick(now=t0 + timedelta(seconds=61)))
        assert UsageRecord.objects.filter(lease_id__in=[x.pk for x in running]).count() == n
        counts.append(len([q for q in sql if "SAVEPOINT" not in q]))
        Lease.objects.filter(pk__in=[x.pk for x in running]).update(state=Lease.State.ENDED)
    # read the leases, the wallets; lock the batch, the accounts; the known keys; insert the transactions,
    # their entries, the usage records; update the balances and the leases; the hard-capped projects (budgets):
    # a dozen statements for any batch
    assert counts[0] == counts[1] <= 14


def test_a_lease_shows_one_ledger_row_per_minute_and_is_billed_price_times_seconds_exactly():
    fleet = Fleet()
    fleet.node("l4:1", price="1.00")  # 1.80/h
    t0 = timezone.now().replace(second=0, microsecond=0) - timedelta(hours=1)
    [lease] = _running(fleet, 1, t0=t0 + timedelta(seconds=17))
    for s in range(5, 600, 5):  # ten minutes of 5-second ticks
        leases.meter_tick(now=t0 + timedelta(seconds=s, milliseconds=300))
    leases.lease_end(lease_id=lease.pk, at=t0 + timedelta(seconds=600, milliseconds=700))
    charges = LedgerTransaction.objects.filter(lease_id=lease.pk, kind="usage")
    assert charges.count() == 10  # 17 s..1 min, eight whole minutes, the last minute (not 117 rows)
    lease.refresh_from_db()
    assert lease.cost_charged == D("0.291500")  # 583 s at 1.80/h
    minutes = list(UsageRecord.objects.filter(lease_id=lease.pk).order_by("minute").values_list("seconds", flat=True))
    assert minutes == [43] + [60] * 9 and sum(minutes) == 583


def test_postings_are_spread_over_the_ticks_of_a_minute(monkeypatch):
    monkeypatch.setattr(metering, "POST_BATCH_MIN", 2)
    fleet = Fleet()
    fleet.node("l4:8", price="1.00")
    t0 = timezone.now().replace(second=0, microsecond=0) - timedelta(hours=2)
    running = _running(fleet, 8, t0=t0)
    posted = []
    for s in range(61, 120, 5):  # the ticks of the next minute: 8 leases, 12 ticks a minute -> 2 a tick
        leases.meter_tick(now=t0 + timedelta(seconds=s))
        posted.append(LedgerTransaction.objects.filter(kind="usage").count())
    assert posted[:4] == [2, 4, 6, 8] and posted[-1] == 8
    assert {x.billed_until for x in Lease.objects.filter(pk__in=[x.pk for x in running])} == {t0 + timedelta(minutes=1)}


def test_the_console_and_the_api_show_the_cost_so_far_between_postings():
    fleet = Fleet()
    fleet.node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "10")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True))
    lease = order.leases.get()
    started = timezone.now() - timedelta(seconds=30)
    Lease.objects.filter(pk=lease.pk).update(started_at=started, accrued_until=started.replace(microsecond=0),
                                             billed_until=started.replace(microsecond=0))
    body = client_for(buyer).get(f"/api/v1/leases/{lease.pk}/").json()
    assert body["cost_charged"] == "0.000000" and D("0.0150") <= D(body["cost"]) <= D("0.0160")  # ~30 s at 1.80/h


# --- read paths share a snapshot -----------------------------------------------------------------------------------

def _count(fn) -> int:
    with CaptureQueriesContext(connection) as ctx:
        fn()
    return len(ctx.captured_queries)


def test_catalog_and_preview_reuse_one_snapshot_within_its_ttl_and_build_it_in_a_constant_number_of_queries(
        settings):
    fleet = Fleet()
    fleet.node("a100-80gb:2", price="2.00")
    buyer = UserFactory()
    quote = lambda: orders.order_quote(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=20))  # noqa: E731
    offers = lambda: catalog.offer_list(filters=catalog.Filters())  # noqa: E731
    snapshot.forget()
    cold_small = _count(offers)
    for _ in range(6):
        fleet.node("a100-80gb:8", price="2.00")
    snapshot.forget()
    cold_large = _count(offers)
    assert cold_large == cold_small  # the snapshot's queries follow tables, not GPUs
    settings.MARKET = {**settings.MARKET, "SNAPSHOT_TTL_SECONDS": 60}
    snapshot.forget()
    offers()
    warm = _count(offers)
    assert warm < cold_large and warm <= 3  # reserved windows now, listings, interruptions: no fleet query
    assert _count(quote) <= 2 and quote().available and quote().profile == "1g.20gb"


def test_a_claim_never_takes_what_a_stale_snapshot_shows_free(settings):
    """Placement decides on a fresh snapshot; even a claim deciding on a stale one re-checks under the lock."""
    from marketplace.claims.windows import SlicesClaim
    from scheduler.core.model import Request
    from scheduler.services.allocation import allocate

    settings.MARKET = {**settings.MARKET, "SNAPSHOT_TTL_SECONDS": 60}
    fleet = Fleet()
    fleet.node("l4:1", price="1.00")
    snapshot.forget()
    stale = snapshot.cached()  # shows the GPU free
    a = UserFactory()
    top_up(a, "10")
    orders.order_place(buyer=a, spec=OrderSpec(mode="on_demand", whole_gpu=True))  # takes it
    now = timezone.now()
    claim = SlicesClaim(request=Request(whole_gpu=True), start=now, end=now + timedelta(hours=1), base=stale,
                        holds_for=lambda gpu_id: [])
    decision, slices = allocate(claim=claim, retries=2)
    assert slices is None and not decision.ok  # lost on the stale view, then decided on fresh ones: none free


# --- the ledger is reconciled in production ---------------------------------------------------------------------

def test_the_periodic_ledger_check_keeps_its_result_and_reports_a_discrepancy(caplog, client):
    buyer = UserFactory()
    top_up(buyer, "5")
    assert ledger_check_run().ok
    Account.objects.filter(user=buyer, kind="wallet").update(balance=D("6"))  # money from nowhere
    with caplog.at_level(logging.ERROR, logger="marketplace.money.check"):
        check = ledger_check_run()
    assert not check.ok and "balance 6" in check.problems[0] and "ledger check found 1 problems" in caplog.text
    operator = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(operator)
    html = client.get("/admin/marketplace/ledgercheck/").content.decode()
    assert "The last ledger check found 1 problems" in html
    assert LedgerCheck.objects.count() == 2


def test_beat_runs_the_ledger_check_by_name():
    from django.conf import settings

    from config.celery import app

    entry = next(e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "money.ledger_check")
    assert entry["schedule"] == settings.MARKET["LEDGER_CHECK_SECONDS"]
    app.loader.import_default_modules()
    assert app.tasks["money.ledger_check"]() is True


# --- the fleet port --------------------------------------------------------------------------------------------

def test_the_market_hears_the_fleet_through_its_registered_port_and_the_fleet_runs_without_one(monkeypatch):
    from marketplace.lifecycle.port import FleetFacts

    assert isinstance(ports.market(), FleetFacts)
    fleet = Fleet()
    fleet.node("a100-80gb:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "10")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=10))
    monkeypatch.setattr(ports, "_market", ports._NoMarket())
    fleet.play()  # the slice becomes ready; no market hears it
    assert order.leases.get().state == Lease.State.PROVISIONING
    monkeypatch.undo()
    lease = order.leases.get()
    leases.slice_ready(sl=lease.slice, at=timezone.now())
    assert Lease.objects.get(pk=lease.pk).state == Lease.State.RUNNING
    assert ledger.wallet_balance(user=buyer) == D("10")
