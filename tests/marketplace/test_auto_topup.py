"""Auto top-up against a real localstripe: a card saved with a SetupIntent, charged off session (a PaymentIntent with
off_session=true) when the wallet is under the threshold after the meter's tick; one charge in flight; turned off
after AUTO_TOPUP_MAX_FAILURES failed charges in a row, with a notice."""
from __future__ import annotations

from decimal import Decimal

import pytest
from django.core import mail
from django.utils import timezone

from marketplace import events, tasks
from marketplace.models import AutoTopUp, Payment
from marketplace.money.check import ledger_check
from marketplace.products import payments
from scheduler.errors import Conflict, DomainError
from tests.factories import UserFactory
from tests.marketplace.marketsim import top_up, wallet
from tests.stripefake import DECLINED_CARD, GOOD_CARD

# localstripe for the session and the settings pointing at it (test_payments.py's fixtures)
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("stripe_on")]


def with_card(user, card: str = GOOD_CARD, *, threshold: str = "10.00", amount: str = "25.00") -> AutoTopUp:
    row, secret = payments.card_setup_start(user=user)
    assert secret.startswith(row.stripe_setup_intent_id) and row.stripe_customer_id.startswith("cus_")
    row = payments.card_setup_finish(user=user, card=card)
    return payments.auto_topup_configure(user=user, enabled=True, threshold=threshold, amount=amount)


def test_a_saved_card_tops_up_a_wallet_under_its_threshold_once():
    buyer = UserFactory()
    top_up(buyer, "5")
    row = with_card(buyer)
    assert row.card_label.endswith("•••• 4242") and row.stripe_payment_method_id.startswith("pm_")
    assert payments.auto_topups_due() == [buyer.pk]
    payment = payments.auto_topup_run(user_id=buyer.pk)
    assert payment.status == Payment.Status.SUCCEEDED and payment.amount == Decimal("25.00")
    assert wallet(buyer) == Decimal("30")
    row.refresh_from_db()
    assert row.in_flight_since is None and row.failures == 0 and row.last_payment_id == payment.pk
    # Over the threshold now: nothing is due and a stray run charges nothing.
    assert payments.auto_topups_due() == [] and payments.auto_topup_run(user_id=buyer.pk) is None
    assert Payment.objects.count() == 1 and ledger_check() == []


def test_one_charge_is_in_flight_at_a_time():
    buyer = UserFactory()
    with_card(buyer)
    AutoTopUp.objects.filter(user=buyer).update(in_flight_since=timezone.now())
    assert payments.auto_topups_due() == []
    assert payments.auto_topup_run(user_id=buyer.pk) is None and not Payment.objects.exists()


def test_the_meters_task_tops_up_after_its_tick():
    buyer = UserFactory()
    with_card(buyer, threshold="1.00", amount="10.00")
    tasks.meter()  # Celery eager in tests: the auto_topup task runs at once
    assert wallet(buyer) == Decimal("10")


def test_a_card_that_keeps_failing_turns_auto_top_up_off_with_a_notice(settings, django_capture_on_commit_callbacks,
                                                                        monkeypatch):
    settings.MARKET = {**settings.MARKET, "AUTO_TOPUP_MAX_FAILURES": 3}
    buyer = UserFactory(email="buyer@example.com")
    heard = []
    monkeypatch.setattr(events, "announce_buyer", lambda user_id, event: heard.append(event["type"]))
    with_card(buyer, DECLINED_CARD)  # saved fine, declined when charged
    with django_capture_on_commit_callbacks(execute=True):
        for attempt in (1, 2, 3):
            assert payments.auto_topup_run(user_id=buyer.pk) is None
            row = AutoTopUp.objects.get(user=buyer)
            assert row.failures == attempt and row.in_flight_since is None
            assert row.enabled == (attempt < 3)
    assert "declined" in row.last_error and row.disabled_reason.startswith("turned off after 3 failed charges")
    assert [m.subject for m in mail.outbox] == ["Auto top-up is off: your card was not charged"]
    assert heard == ["alert_firing"]  # the console hears it once, as the alert
    assert wallet(buyer) == 0 and payments.auto_topups_due() == []
    # A new card and turning it on again start afresh.
    payments.card_setup_start(user=buyer)
    payments.card_setup_finish(user=buyer, card=GOOD_CARD)
    assert AutoTopUp.objects.get(user=buyer).failures == 0


def test_auto_top_up_needs_a_saved_card_and_sane_amounts():
    buyer = UserFactory()
    with pytest.raises(Conflict, match="Save a card first"):
        payments.auto_topup_configure(user=buyer, enabled=True, threshold="10", amount="25")
    with pytest.raises(Conflict, match="Start saving a card first"):
        payments.card_setup_finish(user=buyer, card=GOOD_CARD)
    for threshold, amount in (("-1", "25"), ("10.001", "25"), ("10", "0.50"), ("10", "20000")):
        with pytest.raises(DomainError):
            payments.auto_topup_configure(user=buyer, enabled=False, threshold=threshold, amount=amount)


def test_the_api_saves_a_card_and_turns_auto_top_up_on():
    from rest_framework.test import APIClient

    buyer = UserFactory()
    c = APIClient()
    c.force_authenticate(buyer)
    assert c.get("/api/v1/auto-topup/").json()["card"] == ""
    refused = c.post("/api/v1/auto-topup/", {"enabled": True, "threshold": "10.00", "amount": "50.00"}, format="json")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "no_card"
    setup = c.post("/api/v1/auto-topup/card/").json()
    assert setup["setup_intent"].startswith("seti_") and setup["client_secret"].startswith(setup["setup_intent"])
    saved = c.post("/api/v1/auto-topup/card/confirm/", {"card": GOOD_CARD}, format="json").json()
    assert saved["card"].endswith("•••• 4242")
    on = c.post("/api/v1/auto-topup/", {"enabled": True, "threshold": "10.00", "amount": "50.00"}, format="json")
    assert on.status_code == 200 and on.json()["enabled"] is True and on.json()["amount"] == "50.00"
    bad = c.post("/api/v1/auto-topup/", {"enabled": True, "threshold": "10.00", "amount": "0.10"}, format="json")
    assert bad.status_code == 400 and "amount" in bad.json()["error"]["fields"]


def test_the_billing_page_refuses_to_turn_auto_top_up_on_without_a_card_beside_the_form(client):
    buyer = UserFactory()
    client.force_login(buyer)
    page = client.post("/billing/auto-topup/", {"auto-enabled": "on", "auto-threshold": "5.00", "auto-amount": "20.00"})
    assert page.status_code == 400 and "Save a card first" in page.content.decode()
    assert not AutoTopUp.objects.filter(user=buyer, enabled=True).exists()
    ok = client.post("/billing/auto-topup/", {"auto-threshold": "5.00", "auto-amount": "20.00"})
    assert ok.status_code == 302 and ok.url.endswith("#auto-topup")
    assert AutoTopUp.objects.get(user=buyer).threshold == Decimal("5.00")
