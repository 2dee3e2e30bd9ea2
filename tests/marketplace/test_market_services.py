"""Market services on the database with simulated agents: on demand, queue, spot, reservations, resale."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace.models import Interruption, Lease, Order, Reservation, ResaleListing, SpotPrice, UsageRecord
from marketplace.services import ledger, leases, metering, orders, resale, reservations, spot
from marketplace.services.orders import OrderSpec
from scheduler.errors import Conflict, DomainError
from scheduler.models import AgentCommand, Slice
from tests.factories import UserFactory
from tests.marketplace.marketsim import Fleet, top_up, wallet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    return Fleet()


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
    metering.meter_tick(now=t0 + timedelta(seconds=90))
    metering.meter_tick(now=t0 + timedelta(seconds=3600))
    leases.lease_end(lease_id=lease.pk, buyer=buyer, at=t0 + timedelta(seconds=3600, milliseconds=500))
    fleet.play()
    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDED and lease.slice.state == Slice.State.DESTROYED
    assert lease.cost_charged == Decimal("0.514286")
    assert wallet(buyer) == Decimal("100") - Decimal("0.514286")
    assert ledger.ledger_check() == []
    usage = UsageRecord.objects.filter(lease_id=lease.pk)
    assert sum(u.seconds for u in usage) == 3600 and sum(u.amount for u in usage) == Decimal("0.514286")
    assert node.provider.money_accounts.get(kind="earnings").balance > 0
