"""Stripe top-ups and refunds against a real localstripe process; the webhook verified and applied once."""
from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from decimal import Decimal as D

import pytest
import stripe
from django.db import close_old_connections
from rest_framework.test import APIClient

from marketplace.models import AutoTopUp, LedgerTransaction, Payment, StripeEvent
from marketplace.money import ledger, movements
from marketplace.money.check import ledger_check
from tests.factories import UserFactory, client_for
from tests.stripefake import DECLINED_CARD, GOOD_CARD, WEBHOOK_SECRET

def post_webhook(client, signature: str, body: bytes):
    return client.generic("POST", "/stripe/webhook/", body, content_type="application/json",
                          HTTP_STRIPE_SIGNATURE=signature)


def sign(body: bytes, secret: str = WEBHOOK_SECRET, at: int | None = None) -> str:
    at = at or int(time.time())
    return f"t={at},v1=" + hmac.new(secret.encode(), f"{at}.".encode() + body, hashlib.sha256).hexdigest()


def intent_succeeded_event(payment: Payment, event_id: str = "evt_test_1") -> bytes:
    return json.dumps({"id": event_id, "object": "event", "type": "payment_intent.succeeded", "data": {"object": {
        "id": payment.stripe_payment_intent_id, "object": "payment_intent", "amount": int(payment.amount * 100),
        "currency": "usd", "status": "succeeded", "metadata": {"user_id": str(payment.user_id)}}}}).encode()


@pytest.mark.django_db
def test_a_good_card_top_up_credits_the_wallet_once_though_the_webhook_comes_too(stripe_on):
    buyer = UserFactory()
    c = client_for(buyer)
    r = c.post("/api/v1/topups/", {"amount": "25.00", "card": GOOD_CARD}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["payment"]["status"] == "succeeded" and body["publishable_key"] == "pk_test_local"
    assert body["client_secret"].startswith(body["payment_intent"]) and body["stripe_js"].endswith("/js.stripe.com/v3/")
    assert ledger.wallet_balance(user=buyer) == D("25")
    signature, event = stripe_on.wait_for("payment_intent.succeeded", body["payment_intent"])
    for _ in range(2):  # Stripe delivers at least once: the same event again changes nothing
        assert post_webhook(APIClient(), signature, event).status_code == 200
    assert ledger.wallet_balance(user=buyer) == D("25")
    assert LedgerTransaction.objects.filter(idempotency_key=f"stripe:pi:{body['payment_intent']}").count() == 1
    assert StripeEvent.objects.filter(processed=True).count() == 1
    assert ledger_check() == []


@pytest.mark.django_db
def test_a_browser_confirmed_top_up_is_credited_by_the_verified_webhook_alone(stripe_on):
    buyer = UserFactory()
    r = client_for(buyer).post("/api/v1/topups/", {"amount": "12.34"}, format="json")
    assert r.status_code == 201 and r.json()["payment"]["status"] == "requires_payment_method"
    intent = r.json()["payment_intent"]
    # What Stripe.js does in the page, straight against the fake Stripe.
    method = stripe.PaymentMethod.create(type="card", card={"number": GOOD_CARD, "exp_month": 1, "exp_year": 2031,
                                                            "cvc": "314"})
    stripe.PaymentIntent.modify(intent, payment_method=method.id)
    assert stripe.PaymentIntent.confirm(intent).status == "succeeded"
    assert ledger.wallet_balance(user=buyer) == D("0")  # not until Stripe says so through the webhook
    signature, event = stripe_on.wait_for("payment_intent.succeeded", intent)
    assert post_webhook(APIClient(), signature, event).json()["processed"] is True
    assert ledger.wallet_balance(user=buyer) == D("12.34")
    assert Payment.objects.get(stripe_payment_intent_id=intent).status == "succeeded"


@pytest.mark.django_db
def test_a_declined_card_gets_a_clear_error_and_credits_nothing(stripe_on):
    buyer = UserFactory()
    r = client_for(buyer).post("/api/v1/topups/", {"amount": "40", "card": DECLINED_CARD}, format="json")
    assert r.status_code == 402, r.content
    error = r.json()["error"]
    assert error["code"] == "card_declined" and error["message"] == "Your card was declined."
    assert error["details"]["decline_code"] == "card_declined"
    payment = Payment.objects.get(user=buyer)
    assert payment.status == "failed" and payment.failure_message == "Your card was declined."
    signature, event = stripe_on.wait_for("payment_intent.payment_failed", payment.stripe_payment_intent_id)
    assert post_webhook(APIClient(), signature, event).status_code == 200
    assert Payment.objects.get(pk=payment.pk).status == "failed"
    assert ledger.wallet_balance(user=buyer) == D("0") and not LedgerTransaction.objects.exists()


@pytest.mark.django_db
def test_a_refund_returns_only_the_unspent_part_to_the_card(stripe_on):
    buyer, provider = UserFactory(), UserFactory()
    c = client_for(buyer)
    payment_id = c.post("/api/v1/topups/", {"amount": "50", "card": GOOD_CARD}, format="json").json()["payment"]["id"]
    movements.charge(kind="usage", buyer=buyer, provider=provider, amount=D("20"), idempotency_key="spent")
    r = c.post(f"/api/v1/payments/{payment_id}/refund/", {}, format="json")  # all 50: 20 are spent
    assert r.status_code == 402 and r.json()["error"]["code"] == "insufficient_funds"
    assert ledger.wallet_balance(user=buyer) == D("30")
    r = c.post(f"/api/v1/payments/{payment_id}/refund/", {"amount": "30"}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["refunded_amount"] == "30.00" and r.json()["status"] == "succeeded"
    payment = Payment.objects.get(pk=payment_id)
    refunds = stripe.Refund.list(payment_intent=payment.stripe_payment_intent_id)
    assert [x.amount for x in refunds.data] == [3000]
    assert ledger.wallet_balance(user=buyer) == D("0")
    assert ledger.balance(account=ledger.platform_account("stripe_clearing")) == D("-20")
    assert ledger_check() == []
    assert client_for(UserFactory()).post(f"/api/v1/payments/{payment_id}/refund/", {}, format="json").status_code == 404


@pytest.mark.django_db
def test_a_full_refund_marks_the_payment_refunded_and_a_second_is_refused(stripe_on):
    buyer = UserFactory()
    c = client_for(buyer)
    payment_id = c.post("/api/v1/topups/", {"amount": "5", "card": GOOD_CARD}, format="json").json()["payment"]["id"]
    assert c.post(f"/api/v1/payments/{payment_id}/refund/").json()["status"] == "refunded"
    r = c.post(f"/api/v1/payments/{payment_id}/refund/")
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_refundable"
    assert ledger.wallet_balance(user=buyer) == D("0")


@pytest.mark.django_db
def test_a_retried_top_up_with_the_same_idempotency_key_is_one_payment(stripe_on):
    c = client_for(UserFactory())
    first = c.post("/api/v1/topups/", {"amount": "9"}, format="json", HTTP_IDEMPOTENCY_KEY="abc")
    again = c.post("/api/v1/topups/", {"amount": "9"}, format="json", HTTP_IDEMPOTENCY_KEY="abc")
    assert first.json()["payment"]["id"] == again.json()["payment"]["id"] and Payment.objects.count() == 1
    assert c.post("/api/v1/topups/", {"amount": "10"}, format="json", HTTP_IDEMPOTENCY_KEY="abc").status_code == 409


@pytest.mark.django_db
@pytest.mark.parametrize("body", [
    {"amount": "0"}, {"amount": "-5"}, {"amount": "10000.01"}, {"amount": "abc"}, {"amount": "1.001"}, {},
    {"amount": "5", "card": "4242"},
])
def test_bad_top_ups_are_refused_with_one_error_shape_and_write_nothing(stripe_on, body):
    r = client_for(UserFactory()).post("/api/v1/topups/", body, format="json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid" and r.json()["error"]["fields"]
    assert not Payment.objects.exists()


@pytest.mark.django_db
def test_a_live_stripe_key_refuses_card_numbers_on_the_server_and_writes_nothing(stripe_on, settings):
    """Only Stripe.js in the browser sees a real card: with a live key `card` is refused before Stripe is called,
    for a top-up and for saving an auto top-up card alike; without `card` both still work."""
    settings.STRIPE_SECRET_KEY = "sk_live_not_a_real_key"
    c = client_for(UserFactory())
    assert c.post("/api/v1/auto-topup/card/", format="json").status_code == 200  # a SetupIntent to confirm
    for path, body in (("/api/v1/topups/", {"amount": "25.00", "card": GOOD_CARD}),
                       ("/api/v1/auto-topup/card/confirm/", {"card": GOOD_CARD})):
        r = c.post(path, body, format="json")
        error = r.json()["error"]
        assert r.status_code == 400 and error["code"] == "card_number_refused", r.content
        assert "browser" in error["message"] and "card" in error["fields"]
    assert not Payment.objects.exists() and not AutoTopUp.objects.exclude(stripe_payment_method_id="").exists()


@pytest.mark.django_db
def test_malformed_json_and_wrong_content_type_are_refused(stripe_on):
    c = client_for(UserFactory())
    assert "JSON" in c.generic("POST", "/api/v1/topups/", "{nope", content_type="application/json").json()["error"]["message"]
    assert c.generic("POST", "/api/v1/topups/", "amount=5", content_type="text/plain").status_code == 415
    assert APIClient().post("/api/v1/topups/", {"amount": "5"}, format="json").status_code in (401, 403)
    assert not Payment.objects.exists()


@pytest.mark.django_db
def test_top_ups_without_a_stripe_key_say_payments_are_not_configured(settings):
    settings.STRIPE_SECRET_KEY = None
    r = client_for(UserFactory()).post("/api/v1/topups/", {"amount": "5"}, format="json")
    assert r.status_code == 503 and r.json()["error"]["code"] == "payments_unavailable"


@pytest.mark.django_db
@pytest.mark.parametrize("tamper", ["wrong_secret", "changed_body", "no_header", "old_timestamp", "garbage"])
def test_a_webhook_with_a_bad_signature_is_refused_and_writes_nothing(settings, tamper):
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    buyer = UserFactory()
    payment = Payment.objects.create(user=buyer, stripe_payment_intent_id="pi_forged", amount=D("100"))
    body = intent_succeeded_event(payment)
    signature = {"wrong_secret": sign(body, secret="whsec_other"), "changed_body": sign(body),
                 "no_header": "", "old_timestamp": sign(body, at=int(time.time()) - 3600),
                 "garbage": "t=1,v1=zzz"}[tamper]
    if tamper == "changed_body":
        body = body.replace(b'"amount": 10000', b'"amount": 99999')
    r = post_webhook(APIClient(), signature, body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_signature"
    assert not StripeEvent.objects.exists() and not LedgerTransaction.objects.exists()
    assert Payment.objects.get(pk=payment.pk).status == "requires_payment_method"


@pytest.mark.django_db
def test_the_webhook_takes_only_post(settings):
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    assert APIClient().get("/stripe/webhook/").status_code == 405


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_same_event_delivered_ten_times_at_once_credits_once(settings):
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    buyer = UserFactory()
    payment = Payment.objects.create(user=buyer, stripe_payment_intent_id="pi_concurrent", amount=D("30"))
    body = intent_succeeded_event(payment, event_id="evt_concurrent")
    signature = sign(body)
    start = threading.Barrier(10)
    statuses: list[int] = []

    def deliver():
        try:
            start.wait()
            statuses.append(post_webhook(APIClient(), signature, body).status_code)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=deliver) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert statuses == [200] * 10
    assert ledger.wallet_balance(user=buyer) == D("30")
    assert StripeEvent.objects.count() == 1 and LedgerTransaction.objects.count() == 1
    assert Payment.objects.get(pk=payment.pk).status == "succeeded"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_distinct_events_for_one_intent_at_once_credit_once(settings):
    """The webhook and the synchronous confirm (or two event ids) race: the ledger key decides."""
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    buyer = UserFactory()
    payment = Payment.objects.create(user=buyer, stripe_payment_intent_id="pi_twice", amount=D("7"))
    bodies = [intent_succeeded_event(payment, event_id=f"evt_{i}") for i in range(6)]
    start = threading.Barrier(6)

    def deliver(body):
        try:
            start.wait()
            post_webhook(APIClient(), sign(body), body)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=deliver, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert StripeEvent.objects.count() == 6
    assert ledger.wallet_balance(user=buyer) == D("7") and LedgerTransaction.objects.count() == 1


def charge_refunded_event(intent_id: str, event_id: str) -> bytes:
    """A `charge.refunded` event around the real Charge that localstripe holds for `intent_id` (localstripe
    does not emit this event itself, so the test signs it with the webhook secret as Stripe would)."""
    latest = stripe.PaymentIntent.retrieve(intent_id).latest_charge
    charge = stripe.Charge.retrieve(latest if isinstance(latest, str) else latest.id)
    return json.dumps({"id": event_id, "object": "event", "type": "charge.refunded",
                       "data": {"object": charge.to_dict()}}).encode()


@pytest.mark.django_db
def test_a_refund_made_outside_the_app_is_reconciled_once_from_stripes_charge_refunded_event(stripe_on):
    buyer = UserFactory()
    c = client_for(buyer)
    payment_id = c.post("/api/v1/topups/", {"amount": "50", "card": GOOD_CARD}, format="json").json()["payment"]["id"]
    payment = Payment.objects.get(pk=payment_id)
    # Refunded in the Stripe dashboard (or by the app, whose database commit then failed): 20 USD.
    stripe.Refund.create(payment_intent=payment.stripe_payment_intent_id, amount=2000)
    event = charge_refunded_event(payment.stripe_payment_intent_id, "evt_refund_outside")
    assert json.loads(event)["data"]["object"]["amount_refunded"] == 2000
    assert post_webhook(APIClient(), "t=1,v1=forged", event).status_code == 400
    assert ledger.wallet_balance(user=buyer) == D("50")
    for _ in range(2):  # delivered twice: mirrored once
        assert post_webhook(APIClient(), sign(event), event).status_code == 200
    payment.refresh_from_db()
    assert payment.refunded_amount == D("20.00") and ledger.wallet_balance(user=buyer) == D("30")
    # The app's own refund of the rest is not doubled by Stripe's event for it (a new event id, total 50).
    r = c.post(f"/api/v1/payments/{payment_id}/refund/", {}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "refunded", r.content
    after = charge_refunded_event(payment.stripe_payment_intent_id, "evt_refund_app")
    assert post_webhook(APIClient(), sign(after), after).status_code == 200
    assert ledger.wallet_balance(user=buyer) == D("0")
    assert ledger.balance(account=ledger.platform_account("stripe_clearing")) == D("0")
    assert StripeEvent.objects.filter(type="charge.refunded", processed=True).count() == 2
    assert ledger_check() == []
