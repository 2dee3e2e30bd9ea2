"""The Stripe Connect adapter (products/payouts/connect.py) against a loopback server that records what the real
`stripe` SDK sends and answers with the object shapes Stripe documents (Account, AccountLink, Transfer, lists and
errors): the call shapes are real without the internet. Then the flows on top of it: connecting a payout account
from the console, an approved payout transferred once (and found again, not re-sent), refused or unreachable, and
the webhook that settles a reversed transfer."""
from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal as D
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.utils import timezone

from marketplace.models import Payout, ProviderProfile, StripeEvent
from marketplace.money import ledger
from marketplace.money.check import ledger_check
from marketplace.money.payouts import payout_balance
from marketplace.products import payouts
from marketplace.products.payouts import connect
from tests.factories import UserFactory
from tests.marketplace.marketsim import earnings
from tests.marketplace.payoutfix import earn, lines, provider_user
from tests.marketplace.test_payments import post_webhook, sign

pytestmark = pytest.mark.django_db

WEBHOOK_SECRET = "whsec_test_" + uuid.uuid4().hex
OLD = timezone.now() - timedelta(days=10)


@dataclass
class Call:
    method: str
    path: str
    query: dict
    form: dict  # the form-encoded body, as Stripe's SDK encodes it (metadata[payout_id]=...)
    headers: dict


@dataclass
class Recorder:
    """What the SDK sent, and what to answer: (status, JSON body) per "METHOD /path", else Stripe's shapes."""

    base: str = ""
    calls: list = field(default_factory=list)
    answers: dict = field(default_factory=dict)
    transfers: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sent(self, method: str, path: str) -> list[Call]:
        return [c for c in self.calls if c.method == method and c.path == path]


def account_object(account_id: str, *, ready: bool = False, metadata: dict | None = None) -> dict:
    return {"id": account_id, "object": "account", "type": "express", "country": "US", "default_currency": "usd",
            "business_type": None, "charges_enabled": False, "payouts_enabled": ready, "details_submitted": ready,
            "capabilities": {"transfers": "active" if ready else "inactive"}, "created": 1767225600,
            "metadata": metadata or {}, "requirements": {"currently_due": [] if ready else [
                "external_account", "individual.dob.day", "tos_acceptance.date"], "disabled_reason": None}}


def transfer_object(form: dict, transfer_id: str) -> dict:
    return {"id": transfer_id, "object": "transfer", "amount": int(form["amount"]), "amount_reversed": 0,
            "balance_transaction": "txn_1Test", "created": 1767225600, "currency": form["currency"],
            "description": form.get("description"), "destination": form["destination"],
            "destination_payment": "py_1Test", "livemode": False,
            "metadata": {k[9:-1]: v for k, v in form.items() if k.startswith("metadata[")},
            "reversals": {"object": "list", "data": [], "has_more": False, "total_count": 0,
                          "url": f"/v1/transfers/{transfer_id}/reversals"},
            "reversed": False, "source_transaction": None, "source_type": "card",
            "transfer_group": form.get("transfer_group")}


def answer(rec: Recorder, call: Call) -> tuple[int, dict]:
    key = f"{call.method} {call.path}"
    if key in rec.answers:
        return rec.answers[key]
    if key == "POST /v1/accounts":
        return 200, account_object("acct_1Test" + uuid.uuid4().hex[:8],
                                   metadata={k[9:-1]: v for k, v in call.form.items() if k.startswith("metadata[")})
    if call.method == "GET" and call.path.startswith("/v1/accounts/"):
        return 200, account_object(call.path.rsplit("/", 1)[1])
    if key == "POST /v1/account_links":
        return 200, {"object": "account_link", "created": 1767225600, "expires_at": 1767225900,
                     "url": f"https://connect.stripe.com/setup/e/{call.form['account']}/{uuid.uuid4().hex[:12]}"}
    if key == "GET /v1/transfers":
        found = [t for t in rec.transfers if t["transfer_group"] == call.query.get("transfer_group")]
        return 200, {"object": "list", "url": "/v1/transfers", "has_more": False, "data": found[:1]}
    if key == "POST /v1/transfers":
        transfer = transfer_object(call.form, "tr_1Test" + uuid.uuid4().hex[:8])
        rec.transfers.append(transfer)
        return 200, transfer
    return 404, {"error": {"type": "invalid_request_error", "message": f"Unrecognized request URL ({key})."}}


@pytest.fixture(scope="module")
def recorder():
    rec = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self):
            parts = urlsplit(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            call = Call(self.command, parts.path, dict(parse_qsl(parts.query)), dict(parse_qsl(body)),
                        {k.lower(): v for k, v in self.headers.items()})
            with rec.lock:
                rec.calls.append(call)
                status, payload = answer(rec, call)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Request-Id", "req_" + uuid.uuid4().hex[:14])
            self.send_header("Stripe-Should-Retry", "false")  # as Stripe says on errors it means
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rec.base = f"http://127.0.0.1:{server.server_port}"
    yield rec
    server.shutdown()


@pytest.fixture
def stripe_at(settings, recorder):
    settings.STRIPE_SECRET_KEY = "sk_test_recorder"
    settings.STRIPE_API_BASE = recorder.base
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.PAYOUT_TRANSFERS = "stripe"
    settings.PAYOUT_HOLD_DAYS = 7.0
    settings.PAYOUT_MINIMUM = D("10.00")
    recorder.calls.clear()
    recorder.answers.clear()
    recorder.transfers.clear()
    return recorder


# --- the adapter's calls, as the SDK sends them ---------------------------------------------------------------------

def test_an_express_account_and_its_onboarding_link_are_asked_for_with_stripes_parameters(stripe_at):
    account_id = connect.account_create(user_id=42, country="DE", email="gpus@example.com")
    (call,) = stripe_at.sent("POST", "/v1/accounts")
    assert call.form == {"type": "express", "country": "DE", "email": "gpus@example.com",
                         "capabilities[transfers][requested]": "true", "metadata[user_id]": "42"}
    assert call.headers["authorization"] == "Bearer sk_test_recorder"
    assert call.headers["idempotency-key"] == "connect-account:42"
    url = connect.account_link(account_id=account_id, refresh_url="https://m.example/r", return_url="https://m.example/b")
    (link,) = stripe_at.sent("POST", "/v1/account_links")
    assert link.form == {"account": account_id, "type": "account_onboarding", "refresh_url": "https://m.example/r",
                         "return_url": "https://m.example/b"}
    assert url.startswith(f"https://connect.stripe.com/setup/e/{account_id}/")


def test_the_account_status_reads_transfers_payouts_and_what_stripe_still_needs(stripe_at):
    status = connect.account_status(account_id="acct_1Waiting")
    assert stripe_at.sent("GET", "/v1/accounts/acct_1Waiting")
    assert (status.ready, status.details_submitted) == (False, False)
    assert "external_account" in status.requirements_due
    stripe_at.answers["GET /v1/accounts/acct_1Ready"] = (200, account_object("acct_1Ready", ready=True))
    assert connect.account_status(account_id="acct_1Ready").ready


def test_a_transfer_is_looked_up_by_its_group_then_created_with_the_payout_as_idempotency_key(stripe_at):
    payout_id = uuid.uuid4()
    t = connect.transfer_send(payout_id=payout_id, provider_id=7, amount=D("25.50"), destination="acct_1Dest")
    (lookup,) = stripe_at.sent("GET", "/v1/transfers")
    assert lookup.query == {"transfer_group": f"payout_{payout_id}", "limit": "1"}
    (create,) = stripe_at.sent("POST", "/v1/transfers")
    assert create.form == {"amount": "2550", "currency": "usd", "destination": "acct_1Dest",
                           "transfer_group": f"payout_{payout_id}", "description": f"GPU Market payout {payout_id}",
                           "metadata[payout_id]": str(payout_id), "metadata[provider_id]": "7"}
    assert create.headers["idempotency-key"] == str(payout_id)
    assert (t.amount_cents, t.destination, t.simulated) == (2550, "acct_1Dest", False) and t.id.startswith("tr_")
    # Sent again (a worker died after Stripe answered): found by its group, not paid twice.
    again = connect.transfer_send(payout_id=payout_id, provider_id=7, amount=D("25.50"), destination="acct_1Dest")
    assert again.id == t.id and len(stripe_at.sent("POST", "/v1/transfers")) == 1


def test_simulated_transfers_call_nothing(stripe_at, settings):
    settings.PAYOUT_TRANSFERS = "simulated"
    payout_id = uuid.uuid4()
    t = connect.transfer_send(payout_id=payout_id, provider_id=7, amount=D("10"), destination="")
    assert t == connect.Transfer(id=f"simulated_{payout_id.hex}", amount_cents=1000, destination="", simulated=True)
    assert stripe_at.calls == []


@pytest.mark.parametrize("error, says", [
    ({"code": "balance_insufficient", "type": "invalid_request_error",
      "message": "You have insufficient available funds in your Stripe account."},
     "The platform's Stripe balance could not cover the transfer."),
    ({"code": "resource_missing", "param": "destination", "type": "invalid_request_error",
      "message": "No such destination: 'acct_1Gone'"}, "Your payout account cannot receive transfers yet"),
    ({"type": "invalid_request_error", "param": "destination",
      "message": "Your destination account needs to have at least one of the following capabilities enabled: "
                 "transfers, crypto_transfers, legacy_payments"}, "Your payout account cannot receive transfers yet"),
])
def test_a_transfer_stripe_refuses_is_final_and_said_in_the_providers_words(stripe_at, error, says):
    stripe_at.answers["POST /v1/transfers"] = (400, {"error": error})
    with pytest.raises(connect.TransferRefused) as exc:
        connect.transfer_send(payout_id=uuid.uuid4(), provider_id=7, amount=D("10"), destination="acct_1Gone")
    assert exc.value.message.startswith(says) and exc.value.code == "transfer_refused"


def test_stripe_failing_on_its_side_is_not_final(stripe_at):
    stripe_at.answers["POST /v1/transfers"] = (500, {"error": {"type": "api_error", "message": "Something broke."}})
    with pytest.raises(connect.TransferNotSent):
        connect.transfer_send(payout_id=uuid.uuid4(), provider_id=7, amount=D("10"), destination="acct_1Dest")


# --- the flows on top of it ----------------------------------------------------------------------------------------

def test_connecting_a_payout_account_from_the_console_creates_one_account_and_sends_to_stripe(client, stripe_at):
    provider = provider_user(country="FR")
    client.force_login(provider)
    r = client.post("/earnings/payout-account/")
    assert r.status_code == 302 and r["Location"].startswith("https://connect.stripe.com/setup/e/acct_1Test")
    profile = ProviderProfile.objects.get(user=provider)
    assert profile.stripe_account_id.startswith("acct_1Test")
    (created,) = stripe_at.sent("POST", "/v1/accounts")
    assert created.form["country"] == "FR" and created.form["metadata[user_id]"] == str(provider.pk)
    (link,) = stripe_at.sent("POST", "/v1/account_links")
    assert link.form["refresh_url"] == "http://testserver/earnings/payout-account/refresh/"
    assert link.form["return_url"] == "http://testserver/earnings/payout-account/return/"
    # An expired link brings the provider back: a fresh link for the same account, no second account.
    r = client.get("/earnings/payout-account/refresh/")
    assert r.status_code == 302 and r["Location"].startswith(f"https://connect.stripe.com/setup/e/{profile.stripe_account_id}/")
    assert len(stripe_at.sent("POST", "/v1/accounts")) == 1 and len(stripe_at.sent("POST", "/v1/account_links")) == 2
    # Back from onboarding with details still missing: told so.
    html = client.get("/earnings/payout-account/return/", follow=True).content.decode()
    assert "Stripe still needs some details" in html and "external_account" in html


def test_an_approved_payout_is_transferred_to_the_providers_account_and_marked_paid(stripe_at):
    provider = provider_user(stripe_account="acct_1Prov")
    earn(provider, "100", at=OLD)
    p = payouts.payout_request(provider=provider, amount=D("45.00"))
    p = payouts.payout_approve(payout_id=p.pk, by=UserFactory(is_staff=True))
    (create,) = stripe_at.sent("POST", "/v1/transfers")
    assert (create.form["amount"], create.form["destination"]) == ("4500", "acct_1Prov")
    assert (p.state, p.transfer_id, p.simulated, p.destination) == (
        Payout.State.PAID, stripe_at.transfers[0]["id"], False, "acct_1Prov")
    assert lines("payout_sent", p.pk) == {"payouts_clearing": D("-45"), "stripe_clearing": D("45")}
    assert ledger_check() == []


def test_a_refused_transfer_fails_the_payout_with_the_money_back(stripe_at):
    provider = provider_user(stripe_account="acct_1Gone")
    earn(provider, "100", at=OLD)
    stripe_at.answers["POST /v1/transfers"] = (400, {"error": {
        "type": "invalid_request_error", "code": "resource_missing", "param": "destination",
        "message": "No such destination: 'acct_1Gone'"}})
    p = payouts.payout_approve(payout_id=payouts.payout_request(provider=provider, amount=D("45")).pk,
                               by=UserFactory(is_staff=True))
    assert p.state == Payout.State.FAILED and "cannot receive transfers yet" in p.failure_reason
    assert earnings(provider) == D("90") and ledger.platform_account("payouts_clearing").balance == 0
    assert ledger_check() == []


def test_a_payout_approved_while_stripe_was_down_is_paid_once_when_sent_again(stripe_at):
    provider = provider_user(stripe_account="acct_1Prov")
    earn(provider, "100", at=OLD)
    stripe_at.answers["POST /v1/transfers"] = (500, {"error": {"type": "api_error", "message": "Something broke."}})
    p = payouts.payout_approve(payout_id=payouts.payout_request(provider=provider, amount=D("45")).pk,
                               by=UserFactory(is_staff=True))
    assert p.state == Payout.State.APPROVED and p.last_error
    del stripe_at.answers["POST /v1/transfers"]
    assert payouts.payouts_resend(now=timezone.now() + timedelta(minutes=10)) == 1
    p.refresh_from_db()
    assert p.state == Payout.State.PAID and len(stripe_at.transfers) == 1
    assert payouts.payout_send(payout_id=p.pk).state == Payout.State.PAID  # nothing more is sent
    assert len(stripe_at.sent("POST", "/v1/transfers")) == 2  # the failed attempt and the one that went through


# --- the webhook -------------------------------------------------------------------------------------------------

def deliver(client, event: dict):
    """The event as Stripe would post it: signed with the webhook secret."""
    body = json.dumps(event).encode()
    return post_webhook(client, sign(body, WEBHOOK_SECRET), body)


def reversed_event(transfer: dict, reversed_cents: int, event_id: str) -> dict:
    obj = {**transfer, "amount_reversed": reversed_cents, "reversed": reversed_cents == transfer["amount"]}
    return {"id": event_id, "object": "event", "api_version": "2026-10-28.endive", "created": int(time.time()),
            "livemode": False, "type": "transfer.reversed", "data": {"object": obj}}


def test_a_reversed_transfer_brings_the_money_back_to_earnings_once_per_total(client, stripe_at):
    provider = provider_user(stripe_account="acct_1Prov")
    earn(provider, "100", at=OLD)
    p = payouts.payout_approve(payout_id=payouts.payout_request(provider=provider, amount=D("50")).pk,
                               by=UserFactory(is_staff=True))
    transfer = stripe_at.transfers[0]
    assert earnings(provider) == D("40")
    r = deliver(client, reversed_event(transfer, 2000, "evt_rev_1"))  # 20 of 50 reversed
    assert r.status_code == 200 and r.json()["processed"] is True
    p.refresh_from_db()
    assert (p.state, p.reversed_amount) == (Payout.State.PAID, D("20.00")) and earnings(provider) == D("60")
    assert deliver(client, reversed_event(transfer, 2000, "evt_rev_1")).status_code == 200  # redelivered
    assert deliver(client, reversed_event(transfer, 1000, "evt_rev_old")).status_code == 200  # older total
    assert earnings(provider) == D("60")
    deliver(client, reversed_event(transfer, 5000, "evt_rev_2"))  # all of it
    p.refresh_from_db()
    assert (p.state, p.reversed_amount) == (Payout.State.FAILED, D("50.00"))
    assert "reversed the transfer" in p.failure_reason
    assert earnings(provider) == D("90") and payout_balance(provider=provider).paid == D("0")
    assert lines("payout_return", p.pk) == {"stripe_clearing": D("-50"), "earnings": D("50")}
    assert ledger_check() == []


def test_a_reversal_of_an_unknown_transfer_is_kept_unprocessed(client, stripe_at):
    r = deliver(client, reversed_event({"id": "tr_1Unknown", "amount": 100, "currency": "usd"}, 100, "evt_x"))
    assert r.status_code == 200 and r.json()["processed"] is False
    assert StripeEvent.objects.get(event_id="evt_x").processed is False and ledger_check() == []


def test_a_connected_accounts_failed_bank_payout_is_kept_and_moves_no_money(client, stripe_at):
    provider = provider_user(stripe_account="acct_1Prov")
    event = {"id": "evt_po_failed", "object": "event", "type": "payout.failed", "account": "acct_1Prov",
             "created": int(time.time()), "livemode": False, "data": {"object": {
                 "id": "po_1", "object": "payout", "amount": 4500, "currency": "usd", "status": "failed",
                 "failure_code": "account_closed", "failure_message": "The bank account has been closed."}}}
    assert deliver(client, event).json()["processed"] is True
    assert payouts.bank_payout_failure(provider=provider)["message"] == "The bank account has been closed."
    later = {**event, "id": "evt_po_paid", "type": "payout.paid",
             "data": {"object": {**event["data"]["object"], "status": "paid", "failure_code": None}}}
    deliver(client, later)
    assert payouts.bank_payout_failure(provider=provider) is None
    assert ledger_check() == []
