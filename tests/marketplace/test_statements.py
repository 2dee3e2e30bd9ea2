"""Statements and earnings to the cent on hand-computed data; projects; list endpoints' permissions and queries."""
from __future__ import annotations

import csv
import io
import uuid
from datetime import datetime, timezone
from decimal import Decimal as D

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from marketplace.models import LedgerTransaction, Project, UsageRecord
from marketplace.services import ledger
from marketplace.services.projects import project_create
from marketplace.services.usage import usage_record
from tests.factories import UserFactory, node_with_token

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:
    c = APIClient()
    c.force_authenticate(user)
    return c


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def dated(txn: LedgerTransaction, when: datetime) -> None:
    """Put a transaction at a fixed instant (statements select by month)."""
    LedgerTransaction.objects.filter(pk=txn.pk).update(created_at=when)
    txn.entries.update(created_at=when)


@pytest.fixture
def november():
    """Hand-computed month. Usage (fee 10%, rounded half-up per charge to the micro-dollar):
    train / h100-80gb 3g.40gb: 60 s 0.123457 + 60 s 0.123457 + 30 s 0.061728 = 150 s 0.308642
    train / h100-80gb 1g.10gb: 60 s 0.005000                                     (0.005 → 0.01 USD)
    serve / a100-80gb whole:   60 s 1.000000 on 30 Nov 23:59 (the 1 Dec minute is December's)
    serve / reservation 10.00 booked 10 Nov. October: 5.00 of usage; top-up 100.00 on 15 Oct.
    """
    buyer, provider = UserFactory(username="alice"), UserFactory(username="bob")
    node, _ = node_with_token(provider=provider, name="rack-7")
    train = project_create(user=buyer, name="train")
    serve = project_create(user=buyer, name="serve")
    dated(ledger.post(kind="topup", memo="t", idempotency_key="t", lines=[
        (ledger.platform_account("stripe_clearing"), D("-100")), (ledger.account_for(user=buyer, kind="wallet"), D("100"))]),
        at("2026-10-15T12:00"))
    lease1, lease2, lease3, lease4 = (uuid.uuid4() for _ in range(4))
    rows = [(lease1, train, "h100-80gb", "3g.40gb", "2026-11-01T10:00", 60, "0.123457", node.pk),
            (lease1, train, "h100-80gb", "3g.40gb", "2026-11-01T10:01", 60, "0.123457", node.pk),
            (lease1, train, "h100-80gb", "3g.40gb", "2026-11-01T10:02", 30, "0.061728", node.pk),
            (lease2, train, "h100-80gb", "1g.10gb", "2026-11-15T00:00", 60, "0.005", node.pk),
            (lease3, serve, "a100-80gb", "", "2026-11-30T23:59", 60, "1", None),
            (lease3, serve, "a100-80gb", "", "2026-12-01T00:00", 60, "1", None),
            (lease4, train, "h100-80gb", "3g.40gb", "2026-10-31T23:59", 60, "5", node.pk)]
    for lease, project, model, profile, minute, seconds, amount, node_id in rows:
        record = usage_record(lease_id=lease, buyer=buyer, provider=provider, project=project, gpu_model=model,
                              profile=profile, minute=at(minute), seconds=seconds, amount=D(amount),
                              node_id=node_id, fee_rate=D("0.10"))
        dated(record.transaction, at(minute))
    dated(ledger.charge(buyer=buyer, provider=provider, amount=D("10"), kind="reservation", project=serve,
                        fee_rate=D("0.10"), idempotency_key="booking"), at("2026-11-10T09:00"))
    return buyer, provider, train, serve, node


def test_a_monthly_statement_is_correct_to_the_cent_per_project_and_slice(november):
    buyer, _, train, serve, _ = november
    r = client_for(buyer).get("/api/v1/statements/", {"month": "2026-11"})
    assert r.status_code == 200, r.content
    body = r.json()
    by_name = {p["project"]["name"]: p for p in body["projects"]}
    assert [(s["gpu_model"], s["profile"], s["gpu_seconds"], s["amount"], s["amount_usd"])
            for s in by_name["train"]["slices"]] == [("h100-80gb", "1g.10gb", 60, "0.005000", "0.01"),
                                                      ("h100-80gb", "3g.40gb", 150, "0.308642", "0.31")]
    assert (by_name["train"]["usage_amount"], by_name["train"]["total_usd"]) == ("0.313642", "0.31")
    assert [(s["profile"], s["gpu_seconds"], s["amount_usd"]) for s in by_name["serve"]["slices"]] == [("whole", 60, "1.00")]
    assert by_name["serve"]["other_charges"] == [{"kind": "reservation", "amount": "10.000000", "amount_usd": "10.00"}]
    assert by_name["serve"]["total_usd"] == "11.00"
    assert body["totals"] == {"gpu_seconds": 270, "usage_amount": "1.313642", "usage_amount_usd": "1.31",
                              "other_charges_amount": "10.000000", "amount": "11.313642", "amount_usd": "11.31"}
    wallet = body["wallet"]
    assert (wallet["opening_balance"], wallet["closing_balance"]) == ("95.000000", "83.686358")
    assert wallet["movements"] == {"reservation": "-10.000000", "usage": "-1.313642"}


def test_a_statement_for_one_project_and_as_csv(november):
    buyer, _, train, _, _ = november
    c = client_for(buyer)
    body = c.get("/api/v1/statements/", {"month": "2026-11", "project": train.pk}).json()
    assert [p["project"]["name"] for p in body["projects"]] == ["train"] and "wallet" not in body
    assert body["totals"]["amount"] == "0.313642"
    r = c.get("/api/v1/statements/", {"month": "2026-11", "format": "csv"})
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(r.content.decode())))
    assert rows[0] == ["month", "project", "item", "gpu_model", "profile", "gpu_seconds", "amount_usd"]
    assert ["2026-11", "serve", "reservation", "", "", "", "10.00"] in rows
    assert rows[-1] == ["2026-11", "", "total", "", "", "270", "11.31"]


def test_provider_earnings_per_node_and_model_with_fees(november):
    _, provider, _, _, node = november
    body = client_for(provider).get("/api/v1/earnings/", {"month": "2026-11"}).json()
    # fees: 0.012346 + 0.012346 + 0.006173 + 0.000500 + 0.100000 = 0.131365
    assert body["usage_totals"] == {"gpu_seconds": 270, "gross": "1.313642", "fee": "0.131365",
                                    "net": "1.182277", "net_usd": "1.18"}
    rows = {(r["node"]["name"] if r["node"] else None, r["gpu_model"]): r for r in body["usage"]}
    assert rows[("rack-7", "h100-80gb")]["gross"] == "0.313642" and rows[(None, "a100-80gb")]["net"] == "0.900000"
    assert body["ledger"] == {"reservation": "9.000000", "usage": "1.182277"}
    assert body["month_net_usd"] == "10.18"


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


def test_usage_is_recorded_and_charged_once_per_lease_minute():
    buyer, provider = UserFactory(), UserFactory()
    ledger.credit(user=buyer, amount=D("1"), idempotency_key="gift", memo="gift")
    lease = uuid.uuid4()
    kwargs = dict(lease_id=lease, buyer=buyer, provider=provider, gpu_model="l4", minute=at("2026-11-02T08:00"),
                  seconds=60, amount=D("0.25"))
    first, again = usage_record(**kwargs), usage_record(**kwargs)
    assert first.pk == again.pk and UsageRecord.objects.count() == 1
    assert ledger.wallet_balance(user=buyer) == D("0.75")
    with pytest.raises(ledger.InsufficientFunds):
        usage_record(**{**kwargs, "minute": at("2026-11-02T08:01"), "amount": D("0.75001")})
    assert UsageRecord.objects.count() == 1 and ledger.wallet_balance(user=buyer) == D("0.75")


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
    ledger.credit(user=alice, amount=D("1"), idempotency_key="g", memo="g", project=Project.objects.get(pk=pid))
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
    assert [e["amount"] for e in r] == ["-1.000000"]
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

    def add(n: int, offset: int):
        from marketplace.models import Payment

        for i in range(offset, offset + n):
            project = project_create(user=buyer, name=f"p{i}")
            ledger.credit(user=buyer, amount=D("1"), idempotency_key=f"g{i}", memo="g", project=project)
            usage_record(lease_id=uuid.uuid4(), buyer=buyer, provider=provider, project=project, gpu_model="l4",
                         minute=at("2026-11-03T10:00"), seconds=60, amount=D("0.5"))
            Payment.objects.create(user=buyer, stripe_payment_intent_id=f"pi_{i}", amount=D("5"))

    add(2, 0)
    few = _queries(c, url)
    add(8, 2)
    assert _queries(c, url) == few <= 6
