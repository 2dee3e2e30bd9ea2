"""Market services on the database with simulated agents: on demand, queue, spot, reservations, resale."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace import amounts
from marketplace.lifecycle import leases
from marketplace.models import (Interruption, Lease, LedgerTransaction, Order, ResaleListing, Reservation, SpotPrice,
                                UsageRecord)
from marketplace.money import ledger
from marketplace.money.check import ledger_check
from marketplace.products import orders, resale, reservations, spot
from marketplace.products.orders import OrderSpec
from scheduler.errors import Conflict, DomainError
from scheduler.models import AgentCommand, Slice
from tests.factories import UserFactory
from tests.marketplace.marketsim import beat, top_up, wallet

pytestmark = pytest.mark.django_db


def running_lease(fleet, buyer, **spec) -> Lease:
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode=spec.pop("mode", "on_demand"), **spec))
    fleet.play()
    return Lease.objects.get(order=order)


def test_an_on_demand_order_runs_on_a_mig_slice_is_billed_per_second_and_ends(fleet):
    node = fleet.node("a100-80gb:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=10))
    lease = Lease.objects.get(order=order)
    assert order.state == Order.State.PLACED and lease.state == Lease.State.PROVISIONING
    assert lease.slice.profile == "1g.10gb"
    fleet.play()
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING and lease.slice.instance_uuid.startswith("MIG-")
    facts = leases.connection_facts(lease)
    assert facts["env"]["CUDA_VISIBLE_DEVICES"] == lease.slice.instance_uuid
    # 1g.10gb on A100-80GB: share max(1/7, 1/8) = 1/7; on demand 1.8 x 2.00 / 7 per hour
    assert lease.price_per_hour == Decimal("0.514286")
    t0 = lease.billed_until
    leases.meter_tick(now=t0 + timedelta(seconds=90))
    leases.meter_tick(now=t0 + timedelta(seconds=3600))
    leases.lease_end(lease_id=lease.pk, buyer=buyer, at=t0 + timedelta(seconds=3600, milliseconds=500))
    fleet.play()
    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDED and lease.slice.state == Slice.State.DESTROYED
    assert lease.cost_charged == Decimal("0.514286")
    assert wallet(buyer) == Decimal("100") - Decimal("0.514286")
    assert ledger_check() == []
    usage = UsageRecord.objects.filter(lease_id=lease.pk)
    assert sum(u.seconds for u in usage) == 3600 and sum(u.amount for u in usage) == Decimal("0.514286")
    assert node.provider.money_accounts.get(kind="earnings").balance > 0


def test_an_order_that_cannot_be_placed_is_refused_at_once_with_reasons_and_writes_nothing(fleet):
    fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "10")
    with pytest.raises(Conflict) as err:
        orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=40))
    assert err.value.code == "unavailable" and err.value.details["reasons"]
    assert not Order.objects.exists() and not Slice.objects.exists()


def test_a_queued_order_waits_with_its_reasons_and_is_placed_by_priority_when_capacity_frees(fleet):
    fleet.node("l4:1")
    a, b, c = UserFactory(), UserFactory(), UserFactory()
    for u in (a, b, c):
        top_up(u, "10")
    first = running_lease(fleet, a, whole_gpu=True)
    low = orders.order_place(buyer=b, spec=OrderSpec(mode="on_demand", if_unavailable="queue"))
    high = orders.order_place(buyer=c, spec=OrderSpec(mode="on_demand", if_unavailable="queue", priority=5))
    assert low.state == high.state == Order.State.QUEUED
    assert low.reasons == {"GPU busy": 1} and low.explain == "No GPU slice is free right now: the one GPU is fully taken."
    assert orders.orders_retry() == 0
    leases.lease_end(lease_id=first.pk, buyer=a)
    fleet.play()
    assert orders.orders_retry() == 1
    low.refresh_from_db(), high.refresh_from_db()
    assert (high.state, low.state) == (Order.State.PLACED, Order.State.QUEUED)


def test_a_failed_provision_frees_the_slice_and_requeues_or_fails_the_order(fleet):
    fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "10")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=10))
    fleet.play(fail_creates=True)
    lease = Lease.objects.get(order=order)
    order.refresh_from_db()
    assert lease.state == Lease.State.FAILED and lease.slice.state == Slice.State.FAILED
    assert order.state == Order.State.FAILED and "provisioning failed" in order.explain
    assert wallet(buyer) == Decimal("10") and ledger_check() == []


def test_an_order_without_enough_money_is_refused_with_402_and_nothing_is_claimed(fleet):
    fleet.node("h100-80gb:1", price="3")
    buyer = UserFactory()
    top_up(buyer, "0.01")
    with pytest.raises(ledger.InsufficientFunds):
        orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True))
    assert not Slice.objects.exists() and not Order.objects.exists()


def test_a_buyer_is_warned_then_stopped_before_the_wallet_goes_negative(fleet, settings):
    settings.MARKET = {**settings.MARKET, "MIN_PREPAID_SECONDS": 60, "BALANCE_WARN_SECONDS": 600,
                       "BALANCE_STOP_SECONDS": 30}
    fleet.node("l4:1", price="3.60")  # on demand 6.48/h = 0.0018/s
    buyer = UserFactory()
    top_up(buyer, "1.00")  # about 555 s of running
    lease = running_lease(fleet, buyer, whole_gpu=True)
    t0 = lease.billed_until
    leases.meter_tick(now=t0 + timedelta(seconds=10))
    lease.refresh_from_db()
    assert lease.warned_at is not None and lease.state == Lease.State.RUNNING
    for s in range(20, 560, 5):
        leases.meter_tick(now=t0 + timedelta(seconds=s))
        assert wallet(buyer) >= 0
    lease.refresh_from_db()
    assert lease.state in (Lease.State.ENDING, Lease.State.ENDED) and lease.end_reason == "insufficient_funds"
    assert Decimal("0") <= wallet(buyer) < Decimal("0.06") and ledger_check() == []


def test_spot_prices_follow_the_free_share_between_half_and_seventy_percent(fleet):
    fleet.node("a100-80gb:2")
    buyer = UserFactory()
    top_up(buyer, "50")
    spot.spot_prices_recompute()
    assert SpotPrice.objects.get(gpu_model="a100-80gb").factor == Decimal("0.5")
    running_lease(fleet, buyer, whole_gpu=True)
    spot.spot_prices_recompute()
    latest = SpotPrice.objects.filter(gpu_model="a100-80gb").order_by("-at", "-pk").first()
    assert latest.factor == Decimal("0.6") and latest.free_share == 0.5


def test_a_spot_lease_is_interrupted_with_notice_when_the_price_passes_its_bid(fleet, settings):
    node = fleet.node("a100-80gb:2", price="1.00")
    spotter, other = UserFactory(), UserFactory()
    top_up(spotter, "50"), top_up(other, "50")
    spot.spot_prices_recompute()  # factor 0.5 of base: a whole GPU costs 0.50/h on spot
    lease = running_lease(fleet, spotter, mode="spot", whole_gpu=True, max_price_per_hour=Decimal("0.55"),
                          webhook_url="https://hooks.example.org/hook")
    assert lease.price_per_hour == Decimal("0.5")
    running_lease(fleet, other, whole_gpu=True)  # the pool fills: the spot price rises to 0.7 x 1.00 = 0.70
    now = timezone.now()
    spot.spot_prices_recompute(now=now)
    lease.refresh_from_db()
    intr = Interruption.objects.get(lease=lease)
    assert lease.state == Lease.State.INTERRUPTING and intr.kind == "price"
    assert intr.notice_seconds == 120 and intr.credited == 0
    notice = AgentCommand.objects.get(op="notice", node=node)
    assert notice.args["instance_uuid"] == lease.slice.instance_uuid and "price" in notice.args["kind"]
    charged = lease.cost_charged
    leases.meter_tick(now=now + timedelta(seconds=60))
    lease.refresh_from_db()
    assert lease.cost_charged == charged  # billing stopped at the interruption
    beat(now=now + timedelta(seconds=121))
    fleet.play()
    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDED and lease.ended_at == intr.deadline
    assert ledger_check() == []


def test_an_on_demand_order_preempts_spot_and_a_short_notice_is_credited(fleet, settings):
    settings.MARKET = {**settings.MARKET, "PREEMPT_NOTICE_SECONDS": 10}
    fleet.node("l4:1", price="1.00")
    spotter, buyer = UserFactory(), UserFactory()
    top_up(spotter, "5"), top_up(buyer, "5")
    lease = running_lease(fleet, spotter, mode="spot", max_price_per_hour=Decimal("1.5"))
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", if_unavailable="queue"))
    assert order.state == Order.State.QUEUED and "spot" in order.explain
    intr = Interruption.objects.get(lease=lease)
    assert intr.kind == "preempted" and intr.notice_seconds == 10 and intr.credited == Decimal("0.50")  # 1 h of 0.5/h
    assert wallet(spotter) > Decimal("5")  # credited more than the few seconds it was billed
    beat(now=timezone.now() + timedelta(seconds=11))
    fleet.play()
    assert orders.orders_retry() == 1
    order.refresh_from_db()
    assert order.state == Order.State.PLACED and ledger_check() == []


def test_a_reservation_is_paid_when_booked_started_and_ended_by_the_beat(fleet):
    fleet.node("a100-80gb:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    now = timezone.now()
    start, end = now + timedelta(hours=2), now + timedelta(hours=4)
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="reserved", memory_gb=40, window_start=start,
                                                           window_end=end))
    r = Reservation.objects.get(order=order)
    # 3g.40gb: share max(3/7, 4/8) = 1/2; booked 2 h ahead: 0.85 x 2.00 x 1/2 = 0.85/h, 2 h = 1.70
    assert (r.profile, r.price_per_hour, r.price_total) == ("3g.40gb", Decimal("0.85"), Decimal("1.70"))
    assert wallet(buyer) == Decimal("98.30")
    beat(now=start + timedelta(seconds=1))
    fleet.play()
    lease = Lease.objects.get(reservation=r)
    assert lease.state == Lease.State.RUNNING and not lease.metered
    beat(now=end + timedelta(seconds=1))
    fleet.play()
    lease.refresh_from_db(), r.refresh_from_db()
    assert lease.state == Lease.State.ENDED and r.state == Reservation.State.DONE
    assert wallet(buyer) == Decimal("98.30") and ledger_check() == []


def test_reservations_never_overlap_on_a_slice_and_on_demand_does_not_take_reserved_slots(fleet):
    fleet.node("l4:1")
    a, b = UserFactory(), UserFactory()
    top_up(a, "100"), top_up(b, "100")
    now = timezone.now()
    spec = OrderSpec(mode="reserved", window_start=now + timedelta(hours=2), window_end=now + timedelta(hours=3))
    orders.order_place(buyer=a, spec=spec)
    with pytest.raises(Conflict):
        orders.order_place(buyer=b, spec=spec)
    with pytest.raises(Conflict):  # no duration: it could still run when the reservation starts
        orders.order_place(buyer=b, spec=OrderSpec(mode="on_demand"))
    short = orders.order_place(buyer=b, spec=OrderSpec(mode="on_demand", duration_seconds=3600))
    assert short.state == Order.State.PLACED
    assert Reservation.objects.count() == 1


def test_a_spot_lease_on_reserved_slots_gets_its_notice_before_the_window_starts(fleet):
    fleet.node("l4:1", price="1.00")
    holder, spotter = UserFactory(), UserFactory()
    top_up(holder, "100"), top_up(spotter, "100")
    now = timezone.now()
    start = now + timedelta(minutes=30)
    orders.order_place(buyer=holder, spec=OrderSpec(mode="reserved", window_start=start,
                                                    window_end=start + timedelta(hours=1)))
    lease = running_lease(fleet, spotter, mode="spot", max_price_per_hour=Decimal("1.5"))
    beat(now=start - timedelta(minutes=10))
    assert not Interruption.objects.exists()
    beat(now=start - timedelta(seconds=130))
    intr = Interruption.objects.get(lease=lease)
    assert intr.kind == "reservation" and intr.notice_seconds >= 120 and intr.credited == 0
    beat(now=intr.deadline + timedelta(seconds=1))
    fleet.play()
    beat(now=start + timedelta(seconds=1))
    fleet.play()
    assert Lease.objects.get(reservation__holder=holder).state == Lease.State.RUNNING


def test_a_resold_window_moves_to_the_buyer_and_the_seller_gets_the_ask_less_the_fee(fleet, settings):
    settings.PLATFORM_FEE_RATE = Decimal("0.10")
    fleet.node("l4:1", price="1.00")
    seller, buyer = UserFactory(), UserFactory()
    top_up(seller, "100"), top_up(buyer, "100")
    now = timezone.now()
    start = now + timedelta(hours=2)
    orders.order_place(buyer=seller, spec=OrderSpec(mode="reserved", window_start=start,
                                                    window_end=start + timedelta(hours=3)))
    r = Reservation.objects.get(holder=seller)
    with pytest.raises(DomainError, match="at most"):
        resale.listing_create(seller=seller, reservation_id=r.pk, starts_at=start + timedelta(hours=1),
                              ends_at=start + timedelta(hours=2), ask_per_hour=Decimal("0.91"))  # > 0.9 x base
    listing = resale.listing_create(seller=seller, reservation_id=r.pk, starts_at=start + timedelta(hours=1),
                                    ends_at=start + timedelta(hours=2), ask_per_hour=Decimal("0.90"))
    before = wallet(seller)
    bought = orders.order_place(buyer=buyer, spec=OrderSpec(mode="resale", listing_id=listing.pk))
    assert bought.state == Order.State.PLACED and bought.total_price == Decimal("0.90")
    assert wallet(seller) - before == Decimal("0.81") and wallet(buyer) == Decimal("99.10")
    pieces = Reservation.objects.filter(parent=r).order_by("starts_at")
    assert [(p.holder_id, p.starts_at - start) for p in pieces] == [
        (seller.pk, timedelta(0)), (buyer.pk, timedelta(hours=1)), (seller.pk, timedelta(hours=2))]
    r.refresh_from_db()
    assert r.state == Reservation.State.SPLIT
    with pytest.raises(Conflict):
        resale.listing_purchase(buyer=UserFactory(), listing_id=listing.pk)
    assert ResaleListing.objects.get(pk=listing.pk).state == ResaleListing.State.SOLD
    assert ledger_check() == []


@pytest.mark.parametrize("spec, field", [
    (dict(mode="on_demand", duration_seconds=0), "duration_seconds"),
    (dict(mode="on_demand", duration_seconds=-5), "duration_seconds"),
    (dict(mode="on_demand", gpu_models=["b300"]), "gpu_models"),
    (dict(mode="spot"), "max_price_per_hour"),
    (dict(mode="reserved"), "window_start"),
    (dict(mode="reserved", window_start=timezone.now() - timedelta(hours=1),
          window_end=timezone.now() + timedelta(hours=1)), "window_start"),
    (dict(mode="reserved", window_start=timezone.now() + timedelta(hours=2),
          window_end=timezone.now() + timedelta(hours=1)), "window_end"),
    (dict(mode="bogus"), "mode"),
])
def test_bad_orders_are_refused_by_field_and_write_nothing(fleet, spec, field):
    fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "10")
    with pytest.raises(DomainError) as err:
        orders.order_place(buyer=buyer, spec=OrderSpec(**spec))
    assert err.value.field == field and not Order.objects.exists()


def test_a_spot_bid_above_the_on_demand_price_is_refused(fleet):
    fleet.node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "10")
    with pytest.raises(DomainError, match="on-demand price") as err:
        orders.order_place(buyer=buyer, spec=OrderSpec(mode="spot", max_price_per_hour=Decimal("1.81")))
    assert err.value.field == "max_price_per_hour" and not Order.objects.exists()


def test_a_lease_with_a_duration_is_never_billed_past_its_end_whichever_beat_runs_first(fleet):
    fleet.node("l4:1", price="3.60")  # on demand 6.48/h
    buyer = UserFactory()
    top_up(buyer, "10")
    lease = running_lease(fleet, buyer, whole_gpu=True, duration_seconds=600)
    t0 = lease.billed_until
    billable = int((lease.ends_at - t0).total_seconds())  # the duration counts from running
    assert billable == 600
    # The meter's beat runs before the lease tick that ends it: the seconds after ends_at are not the buyer's.
    leases.meter_tick(now=t0 + timedelta(seconds=700))
    beat(now=t0 + timedelta(seconds=700))
    fleet.play()
    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDED
    assert lease.cost_charged == (Decimal("6.48") * billable / 3600).quantize(Decimal("0.000001"))
    assert sum(u.seconds for u in UsageRecord.objects.filter(lease_id=lease.pk)) == billable
    assert wallet(buyer) == Decimal("10") - lease.cost_charged and ledger_check() == []


def test_an_undelivered_window_bought_and_partly_resold_refunds_its_holder_not_the_first_seller(fleet, settings):
    settings.PLATFORM_FEE_RATE = Decimal("0.10")
    node = fleet.node("l4:1", price="1.00")
    a, b, c = UserFactory(), UserFactory(), UserFactory()
    for u in (a, b, c):
        top_up(u, "100")
    start = timezone.now() + timedelta(hours=2)
    orders.order_place(buyer=a, spec=OrderSpec(mode="reserved", window_start=start,
                                               window_end=start + timedelta(hours=4)))
    first = resale.listing_create(seller=a, reservation_id=Reservation.objects.get(holder=a).pk,
                                  starts_at=start + timedelta(hours=2), ends_at=start + timedelta(hours=4),
                                  ask_per_hour=Decimal("0.50"))
    b_piece = resale.listing_purchase(buyer=b, listing_id=first.pk).reservation
    second = resale.listing_create(seller=b, reservation_id=b_piece.pk, starts_at=start + timedelta(hours=3),
                                   ends_at=start + timedelta(hours=4), ask_per_hour=Decimal("0.60"))
    resale.listing_purchase(buyer=c, listing_id=second.pk)
    b_left = Reservation.objects.get(holder=b, state=Reservation.State.BOOKED)
    assert b_left.price_total == Decimal("0.50")
    # The node is gone for the whole window: nothing is delivered, each holder gets its own piece back.
    node.status = "offline"
    node.save(update_fields=["status"])
    wallets = {u: wallet(u) for u in (a, b, c)}
    beat(now=start + timedelta(hours=4, seconds=1))
    assert wallet(b) - wallets[b] == Decimal("0.50")
    assert wallet(a) - wallets[a] == Reservation.objects.get(holder=a, state=Reservation.State.REFUNDED).price_total
    assert wallet(c) - wallets[c] == Decimal("0.60") and ledger_check() == []


def test_a_lease_duration_counts_from_when_it_starts_running_not_from_the_order(fleet):
    fleet.node("l4:1", price="3.60")  # on demand 6.48/h
    buyer = UserFactory()
    top_up(buyer, "10")
    ordered = timezone.now() - timedelta(minutes=4)  # the instance took four minutes to carve
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True, duration_seconds=600),
                               now=ordered)
    lease = Lease.objects.get(order=order)
    leases.slice_ready(sl=lease.slice, at=ordered + timedelta(minutes=4))
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING
    assert lease.ends_at == lease.started_at + timedelta(seconds=600)
    t0 = lease.billed_until
    leases.meter_tick(now=t0 + timedelta(seconds=900))
    beat(now=t0 + timedelta(seconds=900))
    lease.refresh_from_db()
    assert lease.cost_charged == Decimal("1.080000")  # 600 s at 6.48/h: the whole duration, all of it running
    assert ledger_check() == []


def test_a_queued_order_with_a_duration_cannot_take_slots_a_reservation_needs_during_provisioning(fleet):
    fleet.node("l4:1", price="1.00")
    a, b = UserFactory(), UserFactory()
    top_up(a, "100")
    top_up(b, "100")
    start = timezone.now() + timedelta(seconds=3600 + 120)
    orders.order_place(buyer=a, spec=OrderSpec(mode="reserved", window_start=start,
                                               window_end=start + timedelta(hours=1)))
    # One hour of running fits before the window only if the instance is carved at once: the order's holds
    # leave room for carving it, so it is refused instead of running into the window.
    with pytest.raises(Conflict):
        orders.order_place(buyer=b, spec=OrderSpec(mode="on_demand", whole_gpu=True, duration_seconds=3600))


@pytest.mark.parametrize("total, weights, expect", [
    ("0.000005", [70, 70, 70], ["0.000001", "0.000002", "0.000002"]),
    ("1.000000", [1, 1, 1], ["0.333333", "0.333333", "0.333334"]),
    ("0.000007", [0, 60, 30], ["0.000000", "0.000004", "0.000003"]),
])
def test_a_price_split_over_windows_adds_up_to_exactly_the_price_to_the_micro_dollar(total, weights, expect):
    assert amounts.spread(Decimal(total), weights) == [Decimal(e) for e in expect]


def test_the_pieces_of_a_split_reservation_never_add_up_to_more_than_it_paid(fleet):
    fleet.node("l4:1", price="1.00")  # reserved 0.85/h
    a, b = UserFactory(), UserFactory()
    top_up(a, "10")
    top_up(b, "10")
    start = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    orders.order_place(buyer=a, spec=OrderSpec(mode="reserved", window_start=start,
                                               window_end=start + timedelta(seconds=210)))
    parent = Reservation.objects.get(holder=a)
    assert parent.price_total == Decimal("0.049583")  # 0.85/h for 210 s, to the micro-dollar (not 5 cents)
    listing = resale.listing_create(seller=a, reservation_id=parent.pk, starts_at=start + timedelta(seconds=70),
                                    ends_at=start + timedelta(seconds=140), ask_per_hour=Decimal("0.50"))
    resale.listing_purchase(buyer=b, listing_id=listing.pk)
    kept = sum(r.price_total for r in Reservation.objects.filter(parent=parent, holder=a))
    # The seller keeps two thirds of what it paid (the sold third is the buyer's now): rounding each piece on
    # its own could make the pieces worth more than the booking (refundable if the platform failed them).
    assert kept == Decimal("0.033055") and kept + parent.price_total / 3 <= parent.price_total + Decimal("0.000001")


def test_a_queued_spot_bid_above_the_on_demand_price_is_refused_though_nothing_is_free_or_online(fleet):
    node = fleet.node("l4:1", price="1.00")  # on demand 1.80/h
    a, b = UserFactory(), UserFactory()
    top_up(a, "10")
    top_up(b, "10")
    running_lease(fleet, a, whole_gpu=True)  # nothing is free: a spot order would wait in the queue
    with pytest.raises(DomainError, match="on-demand price") as err:
        orders.order_place(buyer=b, spec=OrderSpec(mode="spot", max_price_per_hour=Decimal("100000"),
                                                    if_unavailable="queue"))
    assert err.value.field == "max_price_per_hour"
    node.status = "offline"
    node.save(update_fields=["status"])  # nothing is online: the registered node's price still caps the bid
    with pytest.raises(DomainError, match="on-demand price"):
        orders.order_place(buyer=b, spec=OrderSpec(mode="spot", max_price_per_hour=Decimal("1.81"),
                                                    if_unavailable="queue"))
    assert Order.objects.filter(buyer=b).count() == 0
    queued = orders.order_place(buyer=b, spec=OrderSpec(mode="spot", max_price_per_hour=Decimal("1.80"),
                                                         if_unavailable="queue"))
    assert queued.state == Order.State.QUEUED


def test_a_spot_bid_on_a_unit_no_gpu_in_the_catalog_can_serve_is_refused(fleet):
    fleet.node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "10")
    with pytest.raises(DomainError, match="no GPU in the catalog"):
        orders.order_place(buyer=buyer, spec=OrderSpec(mode="spot", gpu_models=["h100-80gb"],
                                                        max_price_per_hour=Decimal("100000"), if_unavailable="queue"))
    assert not Order.objects.exists()


def _book_a100_window(fleet, holder, t0):
    orders.order_place(buyer=holder, now=t0, spec=OrderSpec(
        mode="reserved", gpu_models=["a100-80gb"], memory_gb=10, window_start=t0 + timedelta(hours=2),
        window_end=t0 + timedelta(hours=4)))
    Reservation.objects.filter(holder=holder).update(created_at=t0)  # booked at t0 (auto_now_add says now)
    return Reservation.objects.get(holder=holder)


def test_a_reserved_window_whose_node_goes_offline_moves_to_another_gpu_of_the_unit_and_refunds_the_gap_once(fleet):
    a = fleet.node("a100-80gb:1", price="2.00")
    b = fleet.node("a100-80gb:1", price="2.00")
    holder = UserFactory()
    top_up(holder, "100")
    t0 = timezone.now()
    r = _book_a100_window(fleet, holder, t0)
    first_gpu = r.gpu_id
    reservations.reservations_tick(now=t0 + timedelta(hours=2))
    first = Lease.objects.get(reservation=r)
    leases.slice_ready(sl=first.slice, at=t0 + timedelta(hours=2))
    # The node of the window's GPU goes offline half an hour in.
    lost = next(n for n in (a, b) if n.gpus.filter(pk=first_gpu).exists())
    type(lost).objects.filter(pk=lost.pk).update(status="offline")
    leases.node_offline(node_id=lost.pk, at=t0 + timedelta(hours=2, minutes=30))
    r.refresh_from_db()
    assert r.state == Reservation.State.BOOKED
    reservations.reservations_tick(now=t0 + timedelta(hours=2, minutes=40))
    r.refresh_from_db()
    again = Lease.objects.filter(reservation=r).exclude(pk=first.pk).get()
    assert r.state == Reservation.State.ACTIVE and r.gpu_id != first_gpu and again.slice.gpu_id == r.gpu_id
    leases.slice_ready(sl=again.slice, at=t0 + timedelta(hours=2, minutes=40))
    before = wallet(holder)
    reservations.reservations_tick(now=t0 + timedelta(hours=4))
    reservations.reservations_tick(now=t0 + timedelta(hours=4, seconds=5))
    r.refresh_from_db()
    assert r.state == Reservation.State.DONE
    # Ten minutes of a two-hour window were not delivered: a twelfth of its price, once.
    assert wallet(holder) - before == amounts.micro(r.price_total / 12)
    assert LedgerTransaction.objects.filter(idempotency_key=f"reservation-refund:{r.pk}").count() == 1
    assert ledger_check() == []


def test_a_reserved_window_whose_provision_fails_is_placed_again_on_its_gpu_and_the_wait_is_refunded(fleet):
    fleet.node("a100-80gb:1", price="2.00")
    holder = UserFactory()
    top_up(holder, "100")
    t0 = timezone.now()
    r = _book_a100_window(fleet, holder, t0)
    reservations.reservations_tick(now=t0 + timedelta(hours=2))
    fleet.play(fail_creates=True)
    r.refresh_from_db()
    assert r.state == Reservation.State.BOOKED and Lease.objects.get(reservation=r).state == Lease.State.FAILED
    reservations.reservations_tick(now=t0 + timedelta(hours=2, minutes=6))  # the GPU is fine again
    again = Lease.objects.get(reservation=r, state=Lease.State.PROVISIONING)
    assert again.slice.gpu_id == r.gpu_id
    leases.slice_ready(sl=again.slice, at=t0 + timedelta(hours=2, minutes=6))
    before = wallet(holder)
    reservations.reservations_tick(now=t0 + timedelta(hours=4))
    # Six minutes of 120 were lost: a twentieth of the price comes back.
    assert wallet(holder) - before == amounts.micro(r.price_total / 20)
    assert ledger_check() == []


def test_a_reserved_window_the_beat_starts_late_refunds_the_time_from_its_start_until_its_lease_ran(fleet):
    fleet.node("a100-80gb:1", price="2.00")
    holder = UserFactory()
    top_up(holder, "100")
    # Booked so that the window started ten minutes ago and nothing opened its lease since (the beat was down).
    r = _book_a100_window(fleet, holder, timezone.now() - timedelta(hours=2, minutes=10))
    reservations.reservations_tick()
    lease = Lease.objects.get(reservation=r)
    ran = timezone.now()
    leases.slice_ready(sl=lease.slice, at=ran)
    before = wallet(holder)
    reservations.reservations_tick(now=r.ends_at)
    r.refresh_from_db()
    assert r.state == Reservation.State.DONE
    lost = (ran - r.starts_at).total_seconds()
    assert 600 <= lost < 660
    assert wallet(holder) - before == amounts.micro(r.price_total * Decimal(str(lost)) / Decimal(7200))
    assert ledger_check() == []


def test_a_window_booked_after_its_start_is_late_only_from_its_booking(fleet):
    """A window may start up to a minute before it is booked: the seconds before the booking were never the
    platform's to deliver, and a lease opened at once is on time."""
    fleet.node("a100-80gb:1", price="2.00")
    holder = UserFactory()
    top_up(holder, "100")
    r = _book_a100_window(fleet, holder, timezone.now() - timedelta(hours=2, seconds=50))
    Reservation.objects.filter(pk=r.pk).update(created_at=timezone.now())  # booked now, 50 s after its start
    r.refresh_from_db()
    reservations.reservations_tick()
    lease = Lease.objects.get(reservation=r)
    leases.slice_ready(sl=lease.slice, at=timezone.now())
    assert reservations.undelivered_seconds(r) == 0


def test_the_time_a_window_was_not_delivered_counts_once_where_its_lost_spans_overlap():
    t = timezone.now()
    spans = [(t, t + timedelta(seconds=60)), (t + timedelta(seconds=30), t + timedelta(seconds=90)),
             (t + timedelta(seconds=200), t + timedelta(seconds=400))]
    assert reservations._seconds_covered(spans, start=t + timedelta(seconds=10), end=t + timedelta(seconds=300)) \
        == 80 + 100


@pytest.mark.parametrize("amount, fee, weights", [
    ("0.000050", "0.000005", [60] * 60),        # the wallet's last micro-dollars over an hour of minutes
    ("0.000003", "0.000001", [30, 60, 60, 30]),
    ("1.234567", "0.123457", [1, 60, 59]),
])
def test_a_charge_spread_over_minutes_adds_up_exactly_and_no_minute_is_negative_or_pays_more_fee_than_amount(
        amount, fee, weights):
    pieces = amounts.spread(Decimal(amount), weights)
    fees = amounts.spread_within(Decimal(fee), pieces, weights)
    assert sum(pieces) == Decimal(amount) and sum(fees) == Decimal(fee)
    assert all(a >= 0 and 0 <= f <= a for a, f in zip(pieces, fees))


def test_a_lease_whose_wallet_runs_dry_over_a_long_tick_records_valid_usage_minutes(fleet, settings):
    settings.MARKET = {**settings.MARKET, "MIN_PREPAID_SECONDS": 0}
    fleet.node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "0.000050")  # fifty micro-dollars: what one hour of the meter can still take
    lease = running_lease(fleet, buyer, whole_gpu=True)
    leases.meter_tick(now=lease.billed_until + timedelta(seconds=3600))
    usage = UsageRecord.objects.filter(lease_id=lease.pk)
    assert usage.count() >= 60 and all(u.amount >= 0 and u.fee <= u.amount for u in usage)
    assert sum(u.amount for u in usage) == Decimal("0.000050") == Lease.objects.get(pk=lease.pk).cost_charged
    assert ledger_check() == []
