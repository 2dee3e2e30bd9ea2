"""Capacity under concurrency on PostgreSQL (row locks, the reservation exclusion constraint): threads with
their own connections race for the same slices, windows and listings."""
from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, connections
from django.utils import timezone

from marketplace.models import Lease, Order, ResaleListing, Reservation
from marketplace.money import ledger
from marketplace.money.check import ledger_check
from marketplace.products import orders, resale
from marketplace.products.orders import OrderSpec
from scheduler.errors import DomainError
from scheduler.models import Slice
from tests.factories import UserFactory
from tests.marketplace.marketsim import Fleet, top_up

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def race(fn, args: list, workers: int = 16) -> list:
    """Run fn(arg) for every arg on a thread pool; each thread closes its own connection."""
    def run(arg):
        try:
            return fn(arg)
        except DomainError as exc:
            return exc
        finally:
            connections.close_all()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run, args))


def test_200_concurrent_orders_racing_for_50_slices_give_exactly_50_leases_and_no_slice_twice():
    Fleet().node("a100-80gb:7,l4:1", price="1.00")  # 7 x 7 1g.10gb + one whole L4 = 50 slices of >= 10 GB
    buyers = [UserFactory() for _ in range(40)]
    for b in buyers:
        top_up(b, "100")
    results = race(lambda i: orders.order_place(buyer=buyers[i % 40], spec=OrderSpec(mode="on_demand", memory_gb=10)),
                   list(range(200)))
    placed = [r for r in results if isinstance(r, Order)]
    refused = [r for r in results if isinstance(r, DomainError)]
    assert len(placed) == 50 and len(refused) == 150
    assert {e.code for e in refused} == {"unavailable"}
    assert Lease.objects.count() == 50 and Slice.objects.count() == 50
    layout = Counter(Slice.objects.values_list("gpu_id", "start", "profile"))
    assert max(layout.values()) == 1  # no memory slice given twice
    assert Counter(Slice.objects.values_list("gpu_id", flat=True)).most_common(1)[0][1] == 7


def test_concurrent_reservations_never_overlap_on_a_slice():
    Fleet().node("l4:3", price="1.00")
    buyers = [UserFactory() for _ in range(30)]
    for b in buyers:
        top_up(b, "100")
    start = timezone.now() + timedelta(hours=2)
    windows = [(start + timedelta(minutes=20 * (i % 3)), start + timedelta(minutes=60 + 20 * (i % 3)))
               for i in range(30)]
    results = race(lambda i: orders.order_place(buyer=buyers[i], spec=OrderSpec(
        mode="reserved", window_start=windows[i][0], window_end=windows[i][1])), list(range(30)))
    booked = list(Reservation.objects.all())
    assert 3 <= len(booked) == sum(isinstance(r, Order) for r in results) <= 9
    for a in booked:
        for b in booked:
            if a.pk != b.pk and a.gpu_id == b.gpu_id:
                assert a.ends_at <= b.starts_at or b.ends_at <= a.starts_at
    assert ledger_check() == []


def test_the_database_refuses_an_overlapping_reservation_that_bypasses_the_service():
    node = Fleet().node("a100-80gb:1")
    gpu = node.gpus.get()
    holder = UserFactory()
    start = timezone.now() + timedelta(hours=1)
    common = dict(holder=holder, gpu=gpu, price_per_hour=Decimal("1"), price_total=Decimal("1"))
    Reservation.objects.create(profile="3g.40gb", slot_start=0, slot_end=4, starts_at=start,
                               ends_at=start + timedelta(hours=2), **common)
    Reservation.objects.create(profile="3g.40gb", slot_start=4, slot_end=8, starts_at=start,
                               ends_at=start + timedelta(hours=2), **common)  # other slots: fine
    with pytest.raises(IntegrityError):
        Reservation.objects.create(profile="2g.20gb", slot_start=2, slot_end=4, starts_at=start + timedelta(hours=1),
                                   ends_at=start + timedelta(hours=3), **common)
    connection.close()


def test_concurrent_resale_purchases_sell_a_window_once():
    Fleet().node("l4:1", price="1.00")
    seller = UserFactory()
    top_up(seller, "100")
    start = timezone.now() + timedelta(hours=3)
    orders.order_place(buyer=seller, spec=OrderSpec(mode="reserved", window_start=start,
                                                    window_end=start + timedelta(hours=2)))
    listing = resale.listing_create(seller=seller, reservation_id=Reservation.objects.get().pk,
                                    starts_at=start, ends_at=start + timedelta(hours=1), ask_per_hour=Decimal("0.90"))
    buyers = [UserFactory() for _ in range(20)]
    for b in buyers:
        top_up(b, "10")
    results = race(lambda b: resale.listing_purchase(buyer=b, listing_id=listing.pk), buyers)
    sold = [r for r in results if isinstance(r, resale.Purchase)]
    assert len(sold) == 1 and sum(isinstance(r, DomainError) for r in results) == 19
    assert ResaleListing.objects.get(pk=listing.pk).state == ResaleListing.State.SOLD
    assert Reservation.objects.filter(holder=sold[0].reservation.holder).count() == 1
    assert sorted(ledger.wallet_balance(user=b) for b in buyers)[:2] == [Decimal("9.1"), Decimal("10")]
    assert ledger_check() == []


def test_concurrent_purchases_of_different_listings_of_one_reservation_all_succeed():
    Fleet().node("l4:1", price="1.00")
    seller = UserFactory()
    top_up(seller, "100")
    start = timezone.now() + timedelta(hours=3)
    orders.order_place(buyer=seller, spec=OrderSpec(mode="reserved", window_start=start,
                                                    window_end=start + timedelta(hours=8)))
    r = Reservation.objects.get()
    listings = [resale.listing_create(seller=seller, reservation_id=r.pk, starts_at=start + timedelta(hours=h),
                                      ends_at=start + timedelta(hours=h + 1), ask_per_hour=Decimal("0.90"))
                for h in range(8)]
    buyers = [UserFactory() for _ in listings]
    for b in buyers:
        top_up(b, "10")
    # Each purchase splits the reservation and moves the other open listings to the pieces: a buyer of
    # another listing must then buy from its piece, neither fail on the split original nor deadlock.
    results = race(lambda pair: resale.listing_purchase(buyer=pair[0], listing_id=pair[1].pk),
                   list(zip(buyers, listings)), workers=8)
    assert [type(x).__name__ for x in results] == ["Purchase"] * 8
    assert set(ResaleListing.objects.values_list("state", flat=True)) == {ResaleListing.State.SOLD}
    live = Reservation.objects.filter(state__in=Reservation.LIVE_STATES).order_by("starts_at")
    assert [x.holder_id for x in live] == [b.pk for b in buyers]
    assert ledger_check() == []
