"""Cancelling a reserved window by the published policy (docs/market.md, "Cancelling a window"): the whole price back
until a day before its start or within the grace after booking, half of it later, nothing once it has started;
windows bought on resale are resold, not cancelled. The money goes back through marketplace.money (the ledger check
stays clean), once; the slots are free again; the API action declares its bodies."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.models import LedgerTransaction, Order, ResaleListing, Reservation
from marketplace.money.check import ledger_check
from marketplace.products import orders, reservations, resale
from marketplace.products.orders import OrderSpec
from scheduler.errors import Conflict, NotFound
from tests.factories import UserFactory, client_for
from tests.marketplace.marketsim import Fleet, earnings, top_up, wallet

pytestmark = pytest.mark.django_db


def book(buyer, *, hours_ahead: float, hours: float = 2, now=None) -> Reservation:
    now = now or timezone.now()
    start = (now + timedelta(hours=hours_ahead)).replace(second=0, microsecond=0)
    order = orders.order_place(buyer=buyer, now=now, spec=OrderSpec(
        mode="reserved", gpu_models=["l4"], whole_gpu=True, window_start=start,
        window_end=start + timedelta(hours=hours)))
    return Reservation.objects.get(order=order)



def test_a_window_cancelled_a_day_ahead_is_refunded_in_full_from_the_provider_and_the_fee(fleet):
    provider = UserFactory()
    fleet.node("l4:1", price="1.00", provider=provider)
    buyer = UserFactory()
    top_up(buyer, "20")
    r = book(buyer, hours_ahead=30)
    assert r.price_total == D("1.700000") and wallet(buyer) == D("18.300000")  # 0.85 x base 1.00 x 2 h
    assert earnings(provider) > 0

    cancelled, terms = reservations.reservation_cancel(holder=buyer, reservation_id=r.pk)
    assert (terms.share, terms.refund) == (D("1"), D("1.700000")) and "a day before its start" in terms.why
    assert cancelled.state == Reservation.State.CANCELLED
    assert wallet(buyer) == D("20.000000") and earnings(provider) == 0
    assert Order.objects.get(pk=r.order_id).state == Order.State.CANCELLED
    refund = LedgerTransaction.objects.get(idempotency_key=f"reservation-cancel:{r.pk}")
    assert refund.kind == "reversal" and ledger_check() == []

    # Once: a second cancel is refused and gives nothing more.
    with pytest.raises(Conflict) as err:
        reservations.reservation_cancel(holder=buyer, reservation_id=r.pk)
    assert err.value.code == "not_cancellable" and wallet(buyer) == D("20.000000")

    # The slots are free again: someone else books the same whole GPU for the same window.
    other = UserFactory()
    top_up(other, "20")
    orders.order_place(buyer=other, spec=OrderSpec(mode="reserved", gpu_models=["l4"], whole_gpu=True,
                                                   window_start=r.starts_at, window_end=r.ends_at))
    assert Reservation.objects.filter(holder=other, state=Reservation.State.BOOKED).count() == 1


def test_within_the_grace_after_booking_the_refund_is_full_later_it_is_half_and_started_never(fleet):
    fleet.node("l4:2", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "20")
    now = timezone.now()
    soon = book(buyer, hours_ahead=3, now=now)
    later = book(buyer, hours_ahead=3, now=now)
    paid = wallet(buyer)

    # Booked a minute ago: a mistake, all of it back.
    _, terms = reservations.reservation_cancel(holder=buyer, reservation_id=soon.pk, now=now + timedelta(minutes=1))
    assert terms.refund == soon.price_total and "of booking" in terms.why
    assert wallet(buyer) == paid + soon.price_total

    # Twenty minutes after booking and under a day before the start: half of it, the provider keeps the rest.
    terms = reservations.cancel_terms(reservation=later, now=now + timedelta(minutes=20))
    assert (terms.share, terms.refund) == (D("0.5"), later.price_total / 2) and not terms.refused
    assert terms.why == "cancelled less than a day before its start: 50% of it"
    assert "50% of it later" in reservations.cancel_policy()
    reservations.reservation_cancel(holder=buyer, reservation_id=later.pk, now=now + timedelta(minutes=20))
    assert wallet(buyer) == paid + soon.price_total + later.price_total / 2
    assert ledger_check() == []

    started = book(buyer, hours_ahead=2, now=now)
    before = wallet(buyer)
    with pytest.raises(Conflict) as err:
        reservations.reservation_cancel(holder=buyer, reservation_id=started.pk,
                                        now=started.starts_at + timedelta(minutes=1))
    assert err.value.code == "window_started" and "list the rest of it for resale" in err.value.message
    assert wallet(buyer) == before and Reservation.objects.get(pk=started.pk).state == Reservation.State.BOOKED


def test_a_window_bought_on_resale_is_resold_not_cancelled_and_the_sellers_other_piece_is_refunded_its_share(fleet):
    fleet.node("l4:1", price="1.00")
    seller, buyer = UserFactory(), UserFactory()
    top_up(seller, "20"), top_up(buyer, "20")
    r = book(seller, hours_ahead=30, hours=4)
    listing = resale.listing_create(seller=seller, reservation_id=r.pk, starts_at=r.ends_at - timedelta(hours=1),
                                    ends_at=r.ends_at, ask_per_hour=D("0.5"))
    bought = resale.listing_purchase(buyer=buyer, listing_id=listing.pk).reservation
    with pytest.raises(Conflict) as err:
        reservations.reservation_cancel(holder=buyer, reservation_id=bought.pk)
    assert err.value.code == "bought_on_resale"
    with pytest.raises(Conflict):
        orders.order_cancel(buyer=buyer, order_id=bought.order_id)  # the purchase's order: not cancelled either

    # The seller's first three hours (a piece split off the booking) come back at their share of the booking.
    piece = Reservation.objects.get(holder=seller, state=Reservation.State.BOOKED)
    assert piece.price_total == D("2.550000")  # 3/4 of 3.40
    before = wallet(seller)
    _, terms = reservations.reservation_cancel(holder=seller, reservation_id=piece.pk)
    assert terms.refund == D("2.550000") and wallet(seller) == before + D("2.550000")
    assert Reservation.objects.get(pk=bought.pk).state == Reservation.State.BOOKED  # the buyer's window is untouched
    assert ledger_check() == []


def test_cancelling_withdraws_the_windows_open_listings_and_a_reserved_order_cancels_its_windows(fleet):
    fleet.node("l4:2", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "30")
    r = book(buyer, hours_ahead=30)
    listing = resale.listing_create(seller=buyer, reservation_id=r.pk, starts_at=r.starts_at,
                                    ends_at=r.starts_at + timedelta(hours=1), ask_per_hour=D("0.5"))
    reservations.reservation_cancel(holder=buyer, reservation_id=r.pk)
    assert ResaleListing.objects.get(pk=listing.pk).state == ResaleListing.State.CANCELLED

    other = book(buyer, hours_ahead=30)
    before = wallet(buyer)
    order = orders.order_cancel(buyer=buyer, order_id=other.order_id)
    assert order.state == Order.State.CANCELLED and wallet(buyer) == before + other.price_total
    assert Reservation.objects.get(pk=other.pk).state == Reservation.State.CANCELLED

    with pytest.raises(NotFound):  # someone else's reservation looks like none
        reservations.reservation_cancel(holder=UserFactory(), reservation_id=book(buyer, hours_ahead=40).pk)


def test_the_api_cancels_a_reservation_in_its_declared_shape_and_refuses_in_the_one_error_shape(fleet):
    fleet.node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "20")
    r = book(buyer, hours_ahead=30)
    c = client_for(buyer)
    assert client_for(UserFactory()).post(f"/api/v1/reservations/{r.pk}/cancel/", format="json").status_code == 404
    assert c.post(f"/api/v1/reservations/{r.pk}/cancel/", "x=1",
                  content_type="application/x-www-form-urlencoded").status_code == 415
    assert Reservation.objects.get(pk=r.pk).state == Reservation.State.BOOKED
    resp = c.post(f"/api/v1/reservations/{r.pk}/cancel/")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["reservation"]["state"] == "cancelled" and body["refunded"] == "1.700000"
    assert body["refunded_share"] == "1.000" and "a day before" in body["rule"]
    again = c.post(f"/api/v1/reservations/{r.pk}/cancel/")
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_cancellable"

    schema = APIClient().get("/api/schema/", {"format": "json"}).json()
    op = schema["paths"]["/api/v1/reservations/{id}/cancel/"]["post"]
    assert "requestBody" not in op
    assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ReservationCancelled")
    for code in ("404", "409"):
        assert op["responses"][code]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_cancels_of_one_window_refund_it_once():
    from tests.marketplace.test_market_concurrency import race

    Fleet().node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "20")
    r = book(buyer, hours_ahead=30)
    results = race(lambda _: reservations.reservation_cancel(holder=buyer, reservation_id=r.pk), list(range(8)),
                   workers=8)
    assert sum(not isinstance(x, Exception) for x in results) == 1
    assert {x.code for x in results if isinstance(x, Exception)} == {"not_cancellable"}
    assert wallet(buyer) == D("20.000000")
    assert LedgerTransaction.objects.filter(idempotency_key__startswith="reservation-cancel:").count() == 1
    assert ledger_check() == []
