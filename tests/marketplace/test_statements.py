"""Statements and earnings to the cent on hand-computed data; projects; list endpoints' permissions and queries."""
from __future__ import annotations

import csv
import io
from datetime import datetime, timezone
from decimal import Decimal as D

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from marketplace.lifecycle import leases
from marketplace.models import Lease, LedgerTransaction, Project, UsageRecord
from marketplace.money import ledger, movements
from marketplace.money.check import ledger_check
from marketplace.products import orders
from marketplace.products.orders import OrderSpec
from marketplace.products.projects import project_create
from scheduler.models import Node
from tests.factories import UserFactory, client_for
from tests.marketplace.marketsim import Fleet

pytestmark = pytest.mark.django_db



def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def dated(txn: LedgerTransaction, when: datetime) -> None:
    """Put a transaction at a fixed instant (statements select by month)."""
    LedgerTransaction.objects.filter(pk=txn.pk).update(created_at=when)
    txn.entries.update(created_at=when)


def run_lease(fleet: Fleet, buyer, *, project, model: str, start: datetime, ticks: list[datetime], end: datetime,
              memory_gb: float = 0, whole_gpu: bool = False) -> None:
    """An on-demand lease that ran from `start` to `end`, metered by the beat at `ticks`: placed, carved by the
    agent, started at `start` (as if the agent had answered then), ticked, ended; its charges dated to the
    minutes they cover (statements select wallet movements by month)."""
    order = orders.order_place(buyer=buyer, now=start, spec=OrderSpec(
        mode="on_demand", gpu_models=[model], memory_gb=memory_gb, whole_gpu=whole_gpu, project_id=project.pk))
    fleet.play()
    lease = order.leases.get()
    Lease.objects.filter(pk=lease.pk).update(started_at=start, accrued_until=start, billed_until=start)
    for t in ticks:
        leases.meter_tick(now=t)
    leases.lease_end(lease_id=lease.pk, at=end)
    fleet.play()
    for rec in UsageRecord.objects.filter(lease_id=lease.pk).select_related("transaction"):
        dated(rec.transaction, rec.minute)


@pytest.fixture
def november():
    """A month built through metering. Base prices: H100 4.00 (3g.40gb is half the GPU: 3.60/h on demand, 0.06 a
    minute; 1g.10gb a seventh: 1.028571/h, 0.017143 a minute), L4 1.00 (1.80/h whole, 0.03 a minute); fee 10%
    per charge, half-up to the micro-dollar:
    train / h100-80gb 3g.40gb: 1 Nov 10:00:00-10:02:30 = 60 s 0.06 + 60 s 0.06 + 30 s 0.03 = 150 s 0.150000
    train / h100-80gb 1g.10gb: 15 Nov 00:00-00:01 = 60 s 0.017143                        (0.017143 -> 0.02 USD)
    serve / l4 whole:          30 Nov 23:59 - 1 Dec 00:01 = 60 s 0.03 in November, 60 s in December
    serve / reservation 10.00 booked 10 Nov. October: 60 s of 3g.40gb (0.06); top-up 100.00 on 15 Oct.
    """
    fleet = Fleet()
    buyer, provider = UserFactory(username="alice"), UserFactory(username="bob")
    node = fleet.node("h100-80gb:1", price="4.00", provider=provider)
    Node.objects.filter(pk=node.pk).update(name="rack-7")
    fleet.node("l4:1", price="1.00", provider=provider)
    train = project_create(user=buyer, name="train")
    serve = project_create(user=buyer, name="serve")
    dated(ledger.post(kind="topup", memo="t", idempotency_key="t", lines=[
        (ledger.platform_account("stripe_clearing"), D("-100")), (ledger.account_for(user=buyer, kind="wallet"), D("100"))]),
        at("2026-10-15T12:00"))
    run_lease(fleet, buyer, project=train, model="h100-80gb", memory_gb=40, start=at("2026-10-31T23:59"),
              ticks=[], end=at("2026-11-01T00:00"))
    run_lease(fleet, buyer, project=train, model="h100-80gb", memory_gb=40, start=at("2026-11-01T10:00"),
              ticks=[at("2026-11-01T10:01:00.5"), at("2026-11-01T10:02:01")], end=at("2026-11-01T10:02:30"))
    run_lease(fleet, buyer, project=train, model="h100-80gb", memory_gb=10, start=at("2026-11-15T00:00"),
              ticks=[], end=at("2026-11-15T00:01"))
    run_lease(fleet, buyer, project=serve, model="l4", whole_gpu=True, start=at("2026-11-30T23:59"),
              ticks=[at("2026-12-01T00:00:00.5")], end=at("2026-12-01T00:01"))
    dated(movements.charge(buyer=buyer, provider=provider, amount=D("10"), kind="reservation", project=serve,
                           idempotency_key="booking"), at("2026-11-10T09:00"))
    return buyer, provider, train, serve, node


def test_a_monthly_statement_is_correct_to_the_cent_per_project_and_slice(november):
    buyer, _, train, serve, _ = november
    r = client_for(buyer).get("/api/v1/statements/", {"month": "2026-11"})
    assert r.status_code == 200, r.content
    body = r.json()
    by_name = {p["project"]["name"]: p for p in body["projects"]}
    assert [(s["gpu_model"], s["profile"], s["gpu_seconds"], s["amount"], s["amount_usd"])
            for s in by_name["train"]["slices"]] == [("h100-80gb", "1g.10gb", 60, "0.017143", "0.02"),
                                                      ("h100-80gb", "3g.40gb", 150, "0.150000", "0.15")]
    assert (by_name["train"]["usage_amount"], by_name["train"]["total_usd"]) == ("0.167143", "0.17")
    assert [(s["profile"], s["gpu_seconds"], s["amount_usd"]) for s in by_name["serve"]["slices"]] == [("whole", 60, "0.03")]
    assert by_name["serve"]["other_charges"] == [{"kind": "reservation", "label": "reserved windows",
                                                  "amount": "10.000000", "amount_usd": "10.00"}]
    assert by_name["serve"]["total_usd"] == "10.03"
    assert body["totals"] == {"gpu_seconds": 270, "usage_amount": "0.197143", "usage_amount_usd": "0.20",
                              "other_charges_amount": "10.000000", "amount": "10.197143", "amount_usd": "10.20",
                              "credits_amount": "0", "credits_amount_usd": "0.00"}
    wallet = body["wallet"]
    assert (wallet["opening_balance"], wallet["closing_balance"]) == ("99.940000", "89.742857")
    assert wallet["movements"] == {"reservation": "-10.000000", "usage": "-0.197143"}


def test_a_statement_for_one_project_and_as_csv(november):
    buyer, _, train, _, _ = november
    c = client_for(buyer)
    body = c.get("/api/v1/statements/", {"month": "2026-11", "project": train.pk}).json()
    assert [p["project"]["name"] for p in body["projects"]] == ["train"] and "wallet" not in body
    assert body["totals"]["amount"] == "0.167143"
    r = c.get("/api/v1/statements/", {"month": "2026-11", "format": "csv"})
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(r.content.decode())))
    assert rows[0] == ["month", "project", "item", "gpu_model", "profile", "gpu_seconds", "amount_usd"]
    assert ["2026-11", "serve", "reservation", "", "", "", "10.00"] in rows
    assert rows[-1] == ["2026-11", "", "total", "", "", "270", "10.20"]


def test_provider_earnings_per_node_and_model_with_fees(november):
    _, provider, _, _, node = november
    body = client_for(provider).get("/api/v1/earnings/", {"month": "2026-11"}).json()
    # usage fees: 0.006 + 0.006 + 0.003 (3g.40gb) + 0.001714 (1g.10gb) + 0.003 (l4) = 0.019714; the booking of 10.00
    # (a charge of no order: no node to show it under) 1.00
    assert body["totals"] == {"gpu_seconds": 270, "gross": "10.197143", "fee": "1.019714", "net": "9.177429",
                              "net_usd": "9.18"}
    rows = {(r["node"]["name"] if r["node"] else None, r["gpu_model"]): r for r in body["nodes"]}
    assert rows[("rack-7", "h100-80gb")]["gross"] == "0.167143" and rows[(rows_l4 := next(
        k for k in rows if k[1] == "l4"))]["net"] == "0.027000"
    assert rows_l4[0] is not None
    assert (rows[(None, "")]["gross"], rows[(None, "")]["net"]) == ("10.000000", "9.000000")
    assert body["ledger"] == {"reservation": "9.000000", "usage": "0.177429"}


@pytest.mark.parametrize("month", ["2026-13", "11-2026", "nope", "2026-1"])
def test_a_malformed_month_is_a_clear_400(month):
    r = client_for(UserFactory()).get("/api/v1/statements/", {"month": month})
    assert r.status_code == 400 and r.json()["error"]["fields"] == {"month": [r.json()["error"]["message"]]}


def test_someone_elses_project_is_not_found_in_statements_usage_and_ledger(november):
    _, _, train, _, _ = november
    c = client_for(UserFactory())
    for url in ("/api/v1/statements/", "/api/v1/usage/", "/api/v1/ledger-entries/"):
        assert c.get(url, {"project": train.pk}).status_code == 404, url
    assert c.get(f"/api/v1/projects/{train.pk}/").status_code == 404
    assert c.get("/api/v1/usage/").json()["results"] == []
    assert c.get("/api/v1/ledger-entries/").json()["results"] == []
    assert c.get("/api/v1/wallet/").json()["balance"] == "0.000000"


def test_metering_posts_each_lease_minute_once_and_never_past_the_wallet():
    fleet = Fleet()
    buyer = UserFactory()
    fleet.node("l4:1", price="1.00")  # 1.80/h whole: 0.03 a minute
    movements.credit(user=buyer, amount=D("1"), idempotency_key="gift", memo="gift")
    t0 = at("2026-11-02T08:00")
    order = orders.order_place(buyer=buyer, now=t0, spec=OrderSpec(mode="on_demand", gpu_models=["l4"]))
    lease = order.leases.get()
    Lease.objects.filter(pk=lease.pk).update(started_at=t0, accrued_until=t0, billed_until=t0)
    leases.meter_tick(now=at("2026-11-02T08:01:02"))
    leases.meter_tick(now=at("2026-11-02T08:01:02"))  # a redelivered tick
    leases.meter_tick(now=at("2026-11-02T08:01:04"))  # the same minute is not due again
    assert list(UsageRecord.objects.values_list("minute", "seconds", "amount")) == [(t0, 60, D("0.030000"))]
    assert LedgerTransaction.objects.filter(kind="usage").count() == 1
    assert ledger.wallet_balance(user=buyer) == D("0.970000")
    # Thirty-two minutes later the wallet holds 0.97 of the 0.99 owed: it pays what it holds, the lease ends.
    leases.meter_tick(now=at("2026-11-02T08:34:01"))
    assert ledger.wallet_balance(user=buyer) == D("0") and ledger_check() == []
    assert Lease.objects.get(pk=lease.pk).state in ("ending", "ended")


def test_projects_are_created_renamed_and_deleted_with_names_unique_per_user():
    alice, bob = UserFactory(), UserFactory()
    c = client_for(alice)
    r = c.post("/api/v1/projects/", {"name": "vision"}, format="json")
    assert r.status_code == 201
    pid = r.json()["id"]
    assert c.post("/api/v1/projects/", {"name": "vision"}, format="json").status_code == 409
    assert client_for(bob).post("/api/v1/projects/", {"name": "vision"}, format="json").status_code == 201
    assert c.post("/api/v1/projects/", {"name": ""}, format="json").status_code == 400
    assert c.patch(f"/api/v1/projects/{pid}/", {"name": "vision-2"}, format="json").json()["name"] == "vision-2"
    assert client_for(bob).delete(f"/api/v1/projects/{pid}/").status_code == 404
    movements.credit(user=alice, amount=D("1"), idempotency_key="g", memo="g", project=Project.objects.get(pk=pid))
    r = c.delete(f"/api/v1/projects/{pid}/")
    assert r.status_code == 409 and r.json()["error"]["code"] == "project_in_use"
    empty = c.post("/api/v1/projects/", {"name": "scratch"}, format="json").json()["id"]
    assert c.delete(f"/api/v1/projects/{empty}/").status_code == 204


def test_ledger_entries_filter_by_account_kind_date_and_project(november):
    buyer, provider, _, serve, _ = november
    c = client_for(buyer)
    kinds = {e["transaction"]["kind"] for e in c.get("/api/v1/ledger-entries/", {"limit": 100}).json()["results"]}
    assert kinds == {"topup", "usage", "reservation"}
    r = c.get("/api/v1/ledger-entries/", {"kind": "reservation"}).json()["results"]
    assert [e["amount"] for e in r] == ["-10.000000"]
    r = c.get("/api/v1/ledger-entries/", {"since": "2026-11-30", "until": "2026-11-30"}).json()["results"]
    assert [e["amount"] for e in r] == ["-0.030000"]
    assert len(c.get("/api/v1/ledger-entries/", {"project": serve.pk}).json()["results"]) == 3
    assert c.get("/api/v1/ledger-entries/", {"since": "yesterday"}).status_code == 400
    assert c.get("/api/v1/ledger-entries/", {"account": "platform_fees"}).status_code == 400
    earned = client_for(provider).get("/api/v1/ledger-entries/", {"account": "earnings"}).json()["count"]
    assert earned == 8


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize("url", ["/api/v1/ledger-entries/", "/api/v1/usage/", "/api/v1/payments/",
                                 "/api/v1/projects/", "/api/v1/wallet/", "/api/v1/statements/?month=2026-11",
                                 "/api/v1/earnings/?month=2026-11"])
def test_list_endpoints_take_a_fixed_number_of_queries(url):
    buyer, provider = UserFactory(), UserFactory()
    c = client_for(buyer if "earnings" not in url else provider)

    fleet = Fleet()
    fleet.node("l4:8", price="1.00", provider=provider)
    t0 = at("2026-11-03T10:00")

    def add(n: int, offset: int):
        from marketplace.models import Payment

        for i in range(offset, offset + n):
            project = project_create(user=buyer, name=f"p{i}")
            movements.credit(user=buyer, amount=D("1"), idempotency_key=f"g{i}", memo="g", project=project)
            run_lease(fleet, buyer, project=project, model="l4", whole_gpu=True, start=t0, ticks=[],
                      end=at("2026-11-03T10:01"))
            Payment.objects.create(user=buyer, stripe_payment_intent_id=f"pi_{i}", amount=D("5"))

    add(2, 0)
    few = _queries(c, url)
    add(8, 2)
    assert _queries(c, url) == few <= 6
