"""Provider payouts on the database: what is payable (the hold, reserved windows, refunds), requests and their
refusals, every transition with its ledger lines (the books stay balanced), the API, the console page and the
admin's approve / reject. Transfers here are simulated (the demo's way); Stripe Connect's calls are in
test_stripe_connect.py, concurrency in test_payouts_concurrency.py."""
from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.models import Account, LedgerTransaction, Payout, ProviderProfile
from marketplace.money import ledger, movements
from marketplace.money.check import ledger_check
from marketplace.money.payouts import payout_balance
from marketplace.products import orders, payouts
from marketplace.products.orders import OrderSpec
from scheduler.errors import Conflict, DomainError, NotFound, PermissionDenied
from tests.factories import UserFactory, client_for
from tests.marketplace.marketsim import Fleet, earnings, top_up
from tests.marketplace.payoutfix import dated, earn, lines, provider_user

pytestmark = pytest.mark.django_db

NOW = timezone.now()
OLD = NOW - timedelta(days=10)  # past the 7-day hold
RECENT = NOW - timedelta(days=2)


@pytest.fixture(autouse=True)
def payout_settings(settings):
    settings.PAYOUT_TRANSFERS = "simulated"
    settings.PAYOUT_HOLD_DAYS = 7.0
    settings.PAYOUT_MINIMUM = D("10.00")
    return settings


@pytest.fixture
def provider():
    return provider_user("prov")


@pytest.fixture
def operator():
    return UserFactory(username="op", is_staff=True, is_superuser=True)



# --- what is payable --------------------------------------------------------------------------------------------

def test_earnings_become_payable_after_the_hold_and_an_open_request_counts_against_them(provider):
    earn(provider, "100", at=OLD)  # 90 net, payable
    earn(provider, "50", at=RECENT)  # 45 net, on hold for 5 more days
    b = payout_balance(provider=provider, now=NOW)
    assert (b.earnings, b.on_hold, b.payable, b.requested) == (D("135"), D("45"), D("90"), D("0"))
    assert b.next_release_at == RECENT + timedelta(days=7)
    payouts.payout_request(provider=provider, amount=D("60"), now=NOW)
    b = payout_balance(provider=provider, now=NOW)
    assert (b.requested, b.payable) == (D("60"), D("30"))
    assert payout_balance(provider=provider, now=RECENT + timedelta(days=7, seconds=1)).payable == D("75")


def test_a_reserved_window_is_on_hold_until_the_hold_after_it_ends(provider):
    """A window the platform fails to deliver is refunded out of earnings when it ends: paid out before, the
    refund would find nothing there."""
    fleet = Fleet()
    fleet.node("l4:1", price="1.00", provider=provider)
    buyer = UserFactory()
    top_up(buyer, "500")
    start = NOW + timedelta(days=3)
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="reserved", window_start=start,
                                                           window_end=start + timedelta(hours=10)))
    booking = LedgerTransaction.objects.get(idempotency_key=f"reservation:{order.reservations.get().pk}")
    dated(booking, NOW - timedelta(days=30))  # booked a month ago: older than the hold, but the window is ahead
    net = earnings(provider)
    assert net > 0
    b = payout_balance(provider=provider, now=NOW)
    assert (b.on_hold, b.payable) == (net, D("0"))
    assert b.next_release_at == start + timedelta(hours=10, days=7)
    assert payout_balance(provider=provider, now=start + timedelta(hours=10, days=7, seconds=1)).payable == net


def test_a_refund_out_of_earnings_counts_at_once(provider):
    earn(provider, "100", at=OLD)
    charge = earn(provider, "100", at=RECENT)  # on hold
    movements.refund(original=charge, idempotency_key="r", amount=D("100"))  # -90 from earnings now
    b = payout_balance(provider=provider, now=NOW)
    assert (b.earnings, b.on_hold) == (D("90"), D("90"))
    assert b.payable == D("0")  # the refunded charge stays on hold until it matures; never below zero


# --- requests and their refusals -----------------------------------------------------------------------------------

def test_a_request_moves_no_money_and_approval_pays_it_through_the_clearing_accounts(provider, operator):
    earn(provider, "100", at=OLD)
    before = earnings(provider)
    p = payouts.payout_request(provider=provider, amount=D("50.00"))
    assert p.state == Payout.State.REQUESTED and earnings(provider) == before
    assert not LedgerTransaction.objects.filter(kind__startswith="payout").exists()
    p = payouts.payout_approve(payout_id=p.pk, by=operator)
    assert (p.state, p.simulated, p.decided_by) == (Payout.State.PAID, True, operator)
    assert p.transfer_id == f"simulated_{p.pk.hex}" and p.paid_at is not None and p.destination == ""
    assert earnings(provider) == before - D("50")
    assert lines("payout", p.pk) == {"earnings": D("-50"), "payouts_clearing": D("50")}
    assert lines("payout_sent", p.pk) == {"payouts_clearing": D("-50"), "stripe_clearing": D("50")}
    assert ledger.platform_account("payouts_clearing").balance == 0
    b = payout_balance(provider=provider)
    assert (b.paid, b.requested, b.in_flight, b.payable) == (D("50"), D("0"), D("0"), D("40"))
    assert ledger_check() == []


@pytest.mark.parametrize("amount, code, status", [
    ("9.99", "below_minimum", 400), ("90.01", "exceeds_payable", 400), ("12.345", "invalid", 400)])
def test_requests_outside_the_rules_are_refused_and_write_nothing(provider, amount, code, status):
    earn(provider, "100", at=OLD)
    earn(provider, "100", at=RECENT)
    with pytest.raises(DomainError) as exc:
        payouts.payout_request(provider=provider, amount=D(amount))
    assert (exc.value.code, exc.value.status, exc.value.field) == (code, status, "amount")
    assert not Payout.objects.exists()


def test_one_payout_is_open_at_a_time(provider, operator):
    earn(provider, "200", at=OLD)
    first = payouts.payout_request(provider=provider, amount=D("20"))
    with pytest.raises(Conflict) as exc:
        payouts.payout_request(provider=provider, amount=D("20"))
    assert exc.value.code == "payout_open"
    payouts.payout_approve(payout_id=first.pk, by=operator)  # paid: no longer open
    assert payouts.payout_request(provider=provider, amount=D("20")).state == Payout.State.REQUESTED


def test_an_account_that_is_not_a_provider_has_no_payouts():
    user = UserFactory()
    earn(user, "100", at=OLD)
    with pytest.raises(PermissionDenied) as exc:
        payouts.payout_request(provider=user, amount=D("20"))
    assert exc.value.code == "not_a_provider"


def test_with_stripe_transfers_a_provider_connects_a_payout_account_before_asking(provider, settings):
    settings.PAYOUT_TRANSFERS = "stripe"
    earn(provider, "100", at=OLD)
    with pytest.raises(Conflict) as exc:
        payouts.payout_request(provider=provider, amount=D("20"))
    assert exc.value.code == "no_payout_account" and not Payout.objects.exists()


# --- cancel, reject, refunds before approval -----------------------------------------------------------------------

def test_the_provider_cancels_a_request_and_an_operator_rejects_one_and_nothing_moves(provider, operator):
    earn(provider, "100", at=OLD)
    p = payouts.payout_request(provider=provider, amount=D("30"))
    assert payouts.payout_cancel(provider=provider, payout_id=p.pk).state == Payout.State.CANCELLED
    with pytest.raises(Conflict, match="This payout is cancelled: it can no longer be approved."):
        payouts.payout_approve(payout_id=p.pk, by=operator)
    q = payouts.payout_request(provider=provider, amount=D("30"))
    q = payouts.payout_reject(payout_id=q.pk, by=operator, note="  bank details under review  ")
    assert (q.state, q.note, q.decided_by) == (Payout.State.REJECTED, "bank details under review", operator)
    with pytest.raises(Conflict):
        payouts.payout_cancel(provider=provider, payout_id=q.pk)
    assert not LedgerTransaction.objects.filter(kind__startswith="payout").exists()
    assert payout_balance(provider=provider).payable == D("90")


def test_someone_elses_payout_is_not_found(provider):
    earn(provider, "100", at=OLD)
    p = payouts.payout_request(provider=provider, amount=D("30"))
    with pytest.raises(NotFound):
        payouts.payout_cancel(provider=provider_user(), payout_id=p.pk)
    with pytest.raises(NotFound):
        payouts.payout_cancel(provider=provider, payout_id="not-a-uuid")


def test_approval_refuses_a_request_that_refunds_since_have_made_unpayable(provider, operator):
    earn(provider, "100", at=OLD)
    charge = earn(provider, "100", at=OLD - timedelta(days=1))
    p = payouts.payout_request(provider=provider, amount=D("150"))
    movements.refund(original=charge, idempotency_key="late refund", amount=D("100"))  # earnings 180 -> 90
    with pytest.raises(Conflict) as exc:
        payouts.payout_approve(payout_id=p.pk, by=operator)
    assert exc.value.code == "exceeds_payable" and "Only 90.00 USD" in exc.value.message
    p.refresh_from_db()
    assert p.state == Payout.State.REQUESTED and earnings(provider) == D("90")
    assert ledger_check() == []


# --- failures after approval ---------------------------------------------------------------------------------------

def test_a_refused_transfer_fails_the_payout_and_puts_the_money_back(provider, operator, monkeypatch):
    from marketplace.products.payouts import connect

    def refuse(**kw):
        raise connect.TransferRefused("Stripe refused the transfer: no.")
    monkeypatch.setattr(connect, "transfer_send", refuse)
    earn(provider, "100", at=OLD)
    p = payouts.payout_approve(payout_id=payouts.payout_request(provider=provider, amount=D("40")).pk, by=operator)
    assert (p.state, p.failure_reason) == (Payout.State.FAILED, "Stripe refused the transfer: no.")
    assert lines("payout_return", p.pk) == {"payouts_clearing": D("-40"), "earnings": D("40")}
    assert earnings(provider) == D("90") and payout_balance(provider=provider).payable == D("90")
    assert ledger_check() == []


def test_an_unreachable_stripe_leaves_the_payout_approved_and_the_beat_sends_it_again(provider, operator,
                                                                                     monkeypatch):
    from marketplace.products.payouts import connect

    real = connect.transfer_send
    monkeypatch.setattr(connect, "transfer_send", lambda **kw: (_ for _ in ()).throw(connect.TransferNotSent()))
    earn(provider, "100", at=OLD)
    p = payouts.payout_approve(payout_id=payouts.payout_request(provider=provider, amount=D("40")).pk, by=operator)
    assert p.state == Payout.State.APPROVED and "could not be reached" in p.last_error
    assert ledger.platform_account("payouts_clearing").balance == D("40")
    assert payout_balance(provider=provider).in_flight == D("40")
    monkeypatch.setattr(connect, "transfer_send", real)
    assert payouts.payouts_resend() == 0  # too soon after the approval
    assert payouts.payouts_resend(now=timezone.now() + timedelta(minutes=6)) == 1
    p.refresh_from_db()
    assert (p.state, p.last_error) == (Payout.State.PAID, "")
    assert ledger.platform_account("payouts_clearing").balance == 0 and ledger_check() == []


def test_without_a_stripe_key_an_approval_is_refused_before_any_money_moves(provider, operator, settings):
    settings.PAYOUT_TRANSFERS = "stripe"
    settings.STRIPE_SECRET_KEY = ""
    ProviderProfile.objects.filter(user=provider).update(stripe_account_id="acct_1Prov")
    earn(provider, "100", at=OLD)
    p = payouts.payout_request(provider=provider, amount=D("40"))
    with pytest.raises(DomainError) as exc:
        payouts.payout_approve(payout_id=p.pk, by=operator)
    assert (exc.value.status, exc.value.code) == (503, "payments_unavailable")
    p.refresh_from_db()
    assert p.state == Payout.State.REQUESTED and earnings(provider) == D("90")


# --- the API -----------------------------------------------------------------------------------------------------

def test_the_api_requests_lists_cancels_and_says_what_is_payable(provider):
    earn(provider, "100", at=OLD)
    earn(provider, "20", at=RECENT)
    c = client_for(provider)
    b = c.get("/api/v1/payouts/balance/").json()
    assert (b["payable"], b["on_hold"], b["minimum"], b["hold_days"], b["transfers"]) == (
        "90.00", "18.000000", "10.00", 7.0, "simulated")
    r = c.post("/api/v1/payouts/", {"amount": "25.50"}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["amount"], body["state"], body["simulated"]) == ("25.50", "requested", False)
    assert c.get("/api/v1/payouts/").json()["results"][0]["id"] == body["id"]
    assert c.get("/api/v1/payouts/balance/").json()["payable"] == "64.50"
    r = c.post("/api/v1/payouts/", {"amount": "10"}, format="json")
    assert r.status_code == 409 and r.json()["error"]["code"] == "payout_open"
    assert c.post(f"/api/v1/payouts/{body['id']}/cancel/").json()["state"] == "cancelled"
    r = c.post(f"/api/v1/payouts/{body['id']}/cancel/")
    assert r.status_code == 409 and r.json()["error"]["message"] == (
        "This payout is cancelled: it can no longer be cancelled.")


@pytest.mark.parametrize("body, code, field", [
    ({"amount": "5"}, "below_minimum", "amount"), ({"amount": "1000"}, "exceeds_payable", "amount"),
    ({"amount": "1.234"}, "invalid", "amount"), ({}, "invalid", "amount"), ({"amount": "lots"}, "invalid", "amount")])
def test_bad_api_requests_get_the_one_error_shape_and_write_nothing(provider, body, code, field):
    earn(provider, "100", at=OLD)
    r = client_for(provider).post("/api/v1/payouts/", body, format="json")
    assert r.status_code == 400, r.content
    error = r.json()["error"]
    assert error["code"] == code and field in error["fields"] and error["message"]
    assert not Payout.objects.exists()


def test_payouts_api_is_for_providers_only_and_json_only(provider):
    c = client_for(UserFactory())
    for r in (c.get("/api/v1/payouts/"), c.get("/api/v1/payouts/balance/"),
              c.post("/api/v1/payouts/", {"amount": "20"}, format="json")):
        assert r.status_code == 403 and r.json()["error"]["code"] == "not_a_provider"
    assert APIClient().get("/api/v1/payouts/").status_code in (401, 403)
    r = client_for(provider).post("/api/v1/payouts/", "amount=20", content_type="application/x-www-form-urlencoded")
    assert r.status_code == 415 and not Payout.objects.exists()


def test_someone_elses_payout_is_a_404_in_the_api(provider):
    earn(provider, "100", at=OLD)
    p = payouts.payout_request(provider=provider, amount=D("30"))
    c = client_for(provider_user())
    assert c.get(f"/api/v1/payouts/{p.pk}/").status_code == 404
    assert c.post(f"/api/v1/payouts/{p.pk}/cancel/").status_code == 404
    p.refresh_from_db()
    assert p.state == Payout.State.REQUESTED


def test_the_payout_list_takes_a_fixed_number_of_queries(provider, operator):
    earn(provider, "1000", at=OLD)
    c = client_for(provider)

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert c.get("/api/v1/payouts/").status_code == 200
        return len(ctx.captured_queries)

    payouts.payout_approve(payout_id=payouts.payout_request(provider=provider, amount=D("10")).pk, by=operator)
    few = count()
    for _ in range(5):
        payouts.payout_approve(payout_id=payouts.payout_request(provider=provider, amount=D("10")).pk, by=operator)
    assert count() == few <= 4


# --- the console page --------------------------------------------------------------------------------------------

def test_the_earnings_page_shows_payable_and_requests_and_cancels_a_payout(client, provider):
    earn(provider, "100", at=OLD)
    earn(provider, "20", at=RECENT)
    client.force_login(provider)
    html = client.get("/earnings/").content.decode()
    assert re.search(r'id="payable">\$90\.00<', html) and re.search(r'id="on-hold">\$18\.00<', html)
    assert 'id="simulated-note"' in html and 'value="90.00"' in html  # the form offers what is payable
    r = client.post("/earnings/payouts/", {"amount": "40.00"})
    assert r.status_code == 302
    html = client.get("/earnings/").content.decode()
    assert "Payout of $40.00 requested" in html and re.search(r'id="payable">\$50\.00<', html)
    p = Payout.objects.get()
    assert f'action="/earnings/payouts/{p.pk}/cancel/"' in html
    assert client.post(f"/earnings/payouts/{p.pk}/cancel/").status_code == 302
    p.refresh_from_db()
    assert p.state == Payout.State.CANCELLED


def test_a_bad_request_on_the_page_is_said_beside_the_amount(client, provider):
    earn(provider, "100", at=OLD)
    client.force_login(provider)
    r = client.post("/earnings/payouts/", {"amount": "500"})
    html = r.content.decode()
    assert r.status_code == 400 and "You can request at most 90.00 USD now" in html
    assert 'aria-invalid="true"' in html and 'value="500"' in html
    assert not Payout.objects.exists()


def test_someone_who_is_not_a_provider_is_told_how_to_get_payouts(client):
    user = UserFactory()
    client.force_login(user)
    html = client.get("/earnings/").content.decode()
    assert 'id="not-a-provider"' in html and "Request payout" not in html
    assert client.post("/earnings/payouts/", {"amount": "20"}).status_code == 400


def test_the_page_says_when_stripe_could_not_pay_the_providers_bank(client, settings):
    from marketplace.models import StripeEvent

    settings.PAYOUT_TRANSFERS = "stripe"
    provider = provider_user(stripe_account="acct_1Prov")
    StripeEvent.objects.create(event_id="evt_po", type="payout.failed", processed=True, payload={
        "id": "evt_po", "type": "payout.failed", "account": "acct_1Prov", "data": {"object": {
            "id": "po_1", "object": "payout", "failure_code": "account_closed",
            "failure_message": "The bank account has been closed."}}})
    client.force_login(provider)
    html = client.get("/earnings/").content.decode()
    assert "Stripe could not pay your bank" in html and "The bank account has been closed." in html
    assert "acct_1Prov" in html and 'id="connect-payout-account"' not in html


# --- the admin -----------------------------------------------------------------------------------------------------

def test_operators_approve_and_reject_in_the_admin(client, provider, operator):
    earn(provider, "100", at=OLD)
    p = payouts.payout_request(provider=provider, amount=D("30"))
    client.force_login(operator)
    r = client.post("/admin/marketplace/payout/", {"action": "approve", "_selected_action": [str(p.pk)]}, follow=True)
    assert "paid by simulated transfer (demo: no Stripe Connect)" in r.content.decode()
    p.refresh_from_db()
    assert p.state == Payout.State.PAID and p.decided_by == operator
    q = payouts.payout_request(provider=provider, amount=D("20"))
    r = client.post("/admin/marketplace/payout/", {"action": "reject", "_selected_action": [str(q.pk)]})
    assert r.status_code == 200 and "The provider reads the reason" in r.content.decode()
    q.refresh_from_db()
    assert q.state == Payout.State.REQUESTED  # only asked for the reason
    r = client.post("/admin/marketplace/payout/", {"action": "reject", "_selected_action": [str(q.pk)],
                                                    "confirm": "yes", "note": "unverified bank account"}, follow=True)
    q.refresh_from_db()
    assert (q.state, q.note) == (Payout.State.REJECTED, "unverified bank account")
    assert ledger_check() == []


def test_staff_without_the_payout_permission_cannot_approve(client, provider):
    earn(provider, "100", at=OLD)
    p = payouts.payout_request(provider=provider, amount=D("30"))
    staff = UserFactory(username="viewer", is_staff=True)
    from django.contrib.auth.models import Permission

    staff.user_permissions.add(Permission.objects.get(codename="view_payout"))
    client.force_login(staff)
    html = client.get("/admin/marketplace/payout/").content.decode()
    assert "Approve and pay" not in html
    client.post("/admin/marketplace/payout/", {"action": "approve", "_selected_action": [str(p.pk)]})
    p.refresh_from_db()
    assert p.state == Payout.State.REQUESTED


def test_the_payouts_clearing_account_is_the_platforms():
    assert ledger.platform_account("payouts_clearing").user_id is None
    assert Account.Kind.PAYOUTS_CLEARING.label == "payouts in flight"
