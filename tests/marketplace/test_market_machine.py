"""A hypothesis state machine driving the market services (top-ups, orders of each mode, agents answering,
metering ticks at any fraction of a minute, spot repricing, interruptions, reservations, a node going offline and
its windows moving to another GPU, resales between projects, ended leases, refunds). After every step the ledger
balances, no wallet is negative, no memory slice is held twice, and each lease's usage records add up to
what the ledger charged it, never more than it accrued. The money side's own machine covers
the ledger alone (tests/marketplace/test_ledger.py)."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from marketplace import amounts, metering
from marketplace.lifecycle import leases
from marketplace.models import (
    Lease,
    LedgerTransaction,
    ResaleListing,
    Reservation,
    UsageRecord,
)
from marketplace.money import movements
from marketplace.money.check import ledger_check
from marketplace.products import orders, resale, spot
from marketplace.products.orders import OrderSpec
from marketplace.products.projects import project_create
from scheduler.errors import DomainError
from scheduler.models import Node, Slice
from tests.factories import UserFactory
from tests.marketplace.marketsim import Fleet, beat, top_up

pytestmark = pytest.mark.django_db


class MarketMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.clock = timezone.now() + timedelta(seconds=1)
        self.atomic = transaction.atomic()
        self.atomic.__enter__()
        # The agents stamp what they report with the machine's clock, not the wall clock: hypothesis replays a
        # run and must see the same start times (and so the same charges) each time.
        self.fleet = Fleet(clock=lambda: self.clock.timestamp())
        # Two prices, so that the engine never breaks a tie by the nodes' random ids (hypothesis replays runs).
        self.nodes = [self.fleet.node("a100-80gb:1,l4:1", price="2.00"), self.fleet.node("a100-80gb:1", price="2.10")]
        self.buyers = [UserFactory() for _ in range(3)]
        self.projects = [project_create(user=b, name="p") for b in self.buyers]

    def teardown(self):
        transaction.set_rollback(True)
        self.atomic.__exit__(None, None, None)

    @staticmethod
    def _pick(data, rows: list):
        """One of `rows` (None when there are none). The draw is the same whatever the database holds: hypothesis
        replays a run by its draws, and a draw made only when rows exist would be a different run when they
        do not."""
        i = data.draw(st.integers(0, 63))
        return rows[i % len(rows)] if rows else None

    def _try(self, fn, *a, **kw):
        try:
            with transaction.atomic():
                return fn(*a, **kw)
        except DomainError:
            return None

    @initialize()
    def buyers_start_with_money(self):
        # Without it most runs spend their steps on refused orders and never reach metering or resale.
        for buyer in self.buyers:
            top_up(buyer, "25")

    @rule(who=st.integers(0, 2), amount=st.sampled_from(["0.05", "1", "25"]))
    def top_up(self, who, amount):
        top_up(self.buyers[who], amount)

    @rule(who=st.integers(0, 2), mode=st.sampled_from(["on_demand", "spot"]), memory=st.sampled_from([0, 10, 40]),
          queue=st.booleans(), duration=st.sampled_from([None, 600]))
    def order(self, who, mode, memory, queue, duration):
        bid = Decimal("3.0") if mode == "spot" else None
        self._try(orders.order_place, buyer=self.buyers[who], now=self.clock, spec=OrderSpec(
            mode=mode, memory_gb=memory, max_price_per_hour=bid, duration_seconds=duration,
            if_unavailable="queue" if queue else "fail"))

    @rule(who=st.integers(0, 2), hours_ahead=st.sampled_from([0, 2]), length=st.sampled_from([1, 3]))
    def reserve(self, who, hours_ahead, length):
        start = self.clock + timedelta(hours=hours_ahead, minutes=1)
        self._try(orders.order_place, buyer=self.buyers[who], now=self.clock, spec=OrderSpec(
            mode="reserved", window_start=start, window_end=start + timedelta(hours=length)))

    @rule(fail=st.booleans())
    def agents_answer(self, fail):
        self.fleet.play(fail_creates=fail)

    @rule(seconds=st.sampled_from([0.4, 1, 5, 61, 900, 3600]))
    def time_passes(self, seconds):
        self.clock += timedelta(seconds=seconds)
        leases.meter_tick(now=self.clock)
        beat(now=self.clock)
        orders.orders_retry(now=self.clock)
        self.fleet.play()

    @rule()
    def spot_prices_move(self):
        spot.spot_prices_recompute(now=self.clock)

    @rule(data=st.data(), price=st.sampled_from(["0.5", "0.71", "1.3"]))
    def a_spot_lease_is_repriced(self, data, price):
        lease_id = self._pick(data, self._leases(mode="spot", state="running"))
        if lease_id:
            leases.lease_reprice(lease_id=lease_id, price=Decimal(price), now=self.clock)

    @rule(which=st.integers(0, 1))
    def a_node_goes_offline_and_comes_back(self, which):
        node = self.nodes[which]
        Node.objects.filter(pk=node.pk).update(status="offline")
        leases.node_offline(node_id=node.pk, at=self.clock)
        beat(now=self.clock)  # a window lost here may move to the other node's A100
        Node.objects.filter(pk=node.pk).update(status="online")
        self.fleet.play()

    @rule(data=st.data(), short=st.booleans())
    def interrupt_a_spot_lease(self, data, short):
        lease_id = self._pick(data, self._leases(mode="spot", state="running"))
        if lease_id:
            leases.lease_interrupt(lease_id=lease_id, kind="preempted", now=self.clock,
                                   deadline=self.clock if short else None)

    @rule(data=st.data())
    def end_a_lease(self, data):
        lease_id = self._pick(data, self._leases(state__in=["running", "provisioning"]))
        if lease_id:
            leases.lease_end(lease_id=lease_id, at=self.clock)

    @rule(data=st.data(), ask=st.sampled_from(["0.10", "0.50"]), who=st.integers(0, 2), in_project=st.booleans())
    def resell(self, data, ask, who, in_project):
        r = self._pick(data, list(Reservation.objects.filter(state="booked", starts_at__gt=self.clock)
                                  .order_by("created_at")))
        if r is None:
            return
        listing = self._try(resale.listing_create, seller=r.holder, reservation_id=r.pk, starts_at=r.starts_at,
                            ends_at=r.starts_at + (r.ends_at - r.starts_at) / 2, ask_per_hour=Decimal(ask),
                            now=self.clock)
        if listing is not None:
            self._try(resale.listing_purchase, buyer=self.buyers[who], listing_id=listing.pk, now=self.clock,
                      project=self.projects[who] if in_project else None)

    @rule(data=st.data())
    def refund_some_usage(self, data):
        t = self._pick(data, list(LedgerTransaction.objects.filter(kind="usage").order_by("created_at")))
        if t is not None:
            self._try(movements.refund, original=t, idempotency_key=f"test-refund:{t.pk}")

    @staticmethod
    def _leases(**where) -> list:
        return list(Lease.objects.filter(**where).order_by("created_at").values_list("id", flat=True))

    @invariant()
    def ledger_balances_and_no_wallet_is_negative(self):
        assert ledger_check() == []

    @invariant()
    def no_lease_is_billed_past_its_end_or_its_interruption(self):
        billed = {}
        for lease_id, seconds in UsageRecord.objects.values_list("lease_id", "seconds"):
            billed[lease_id] = billed.get(lease_id, 0) + seconds
        for lease in Lease.objects.filter(pk__in=list(billed)).select_related("interruption"):
            intr = getattr(lease, "interruption", None)
            stop = min(t for t in (self.clock, lease.ends_at, lease.ended_at, intr and intr.announced_at) if t)
            allowed = (stop - metering.billing_start(lease.started_at)).total_seconds()
            assert billed[lease.pk] <= max(0, allowed), f"{lease} billed {billed[lease.pk]} s of {allowed}"

    @invariant()
    def each_lease_was_charged_what_its_usage_records_say_and_never_more_than_it_accrued(self):
        recorded: dict = {}
        for lease_id, amount in UsageRecord.objects.values_list("lease_id", "amount"):
            recorded[lease_id] = recorded.get(lease_id, Decimal("0")) + amount
        for lease in Lease.objects.filter(metered=True):
            assert recorded.get(lease.pk, Decimal("0")) == lease.cost_charged, lease
            assert lease.cost_charged <= amounts.micro(lease.cost_accrued), lease

    @invariant()
    def no_memory_slice_is_held_twice(self):
        held = {}
        for sl in Slice.objects.filter(state__in=Slice.ACTIVE_STATES):
            for slot in (range(sl.start, sl.start + sl.size) if sl.size else [-1]):
                key = (sl.gpu_id, slot)
                assert key not in held, f"slot {key} held by {held[key]} and {sl.pk}"
                held[key] = sl.pk

    @invariant()
    def sold_windows_belong_to_one_holder(self):
        for listing in ResaleListing.objects.filter(state="sold"):
            assert listing.sold_reservation.holder_id == listing.buyer_id


def test_the_market_keeps_money_and_capacity_consistent_under_any_sequence():
    run_state_machine_as_test(MarketMachine, settings=settings(
        max_examples=50, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]))
