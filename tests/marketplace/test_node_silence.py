"""A node that falls silent (docs/market.md "When a node falls silent"): marked offline past the heartbeat timeout,
its leases kept through the grace and ended only after it, as lost at the last heartbeat with the silent time
refunded; a node heard again within the grace keeps them; most of the fleet silent at once is the platform's own
outage, and nobody is marked offline for it."""
from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace.amounts import micro
from marketplace.lifecycle import leases
from marketplace.models import Lease
from marketplace.money.check import ledger_check
from marketplace.products import orders
from marketplace.products.orders import OrderSpec
from scheduler.models import Node
from scheduler.services import nodes as node_services
from tests.factories import UserFactory
from tests.marketplace.marketsim import top_up, wallet

pytestmark = pytest.mark.django_db
TIMEOUT, GRACE = 10, 60


@pytest.fixture(autouse=True)
def fleet_timing(settings):
    settings.FLEET = {**settings.FLEET, "HEARTBEAT_TIMEOUT_SECONDS": TIMEOUT, "OFFLINE_LEASE_GRACE_SECONDS": GRACE,
                      "OFFLINE_MASS_SHARE": 0.5}


def _running(fleet, buyer) -> Lease:
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", gpu_models=["l4"], whole_gpu=True))
    fleet.play()
    lease = Lease.objects.get(order=order)
    assert lease.state == Lease.State.RUNNING
    return lease


def _silent_since(node, at) -> None:
    Node.objects.filter(pk=node.pk).update(last_heartbeat=at)


def test_a_silent_nodes_leases_end_only_after_the_grace_as_lost_at_its_last_heartbeat_and_the_silence_is_refunded(
        fleet):
    node = fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = _running(fleet, buyer)
    t0 = lease.billed_until
    heard = t0 + timedelta(seconds=100)
    _silent_since(node, heard)
    assert node_services.nodes_mark_offline(now=heard + timedelta(seconds=TIMEOUT + 1)) == [node.pk]
    # Marked offline, yet its lease runs on through the grace, and the meter bills it meanwhile.
    assert node_services.nodes_lose_leases(now=heard + timedelta(seconds=TIMEOUT + GRACE - 1)) == []
    leases.meter_tick(now=t0 + timedelta(seconds=3600))
    assert Lease.objects.get(pk=lease.pk).state == Lease.State.RUNNING
    assert Lease.objects.get(pk=lease.pk).cost_charged > micro(lease.price_per_hour * 100 / Decimal(3600))

    assert node_services.nodes_lose_leases(now=t0 + timedelta(seconds=3600)) == [node.pk]
    lease.refresh_from_db()
    assert lease.state in (Lease.State.ENDING, Lease.State.ENDED)
    assert (lease.end_reason, lease.ended_at) == ("node offline", heard)
    # Billed its 100 running seconds, not one of the silent hour.
    paid = micro(lease.price_per_hour * 100 / Decimal(3600))
    assert lease.accrued_until == heard and lease.cost_charged == paid
    assert wallet(buyer) == Decimal("100") - paid
    assert ledger_check() == []
    # Asked again (its slice is still being destroyed): the node is not told again, nothing more is refunded.
    assert node_services.nodes_lose_leases(now=t0 + timedelta(seconds=3700)) == []
    assert wallet(buyer) == Decimal("100") - paid


def test_a_node_heard_again_within_the_grace_keeps_its_leases(fleet):
    node = fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = _running(fleet, buyer)
    heard = lease.billed_until + timedelta(seconds=30)
    _silent_since(node, heard)
    assert node_services.nodes_mark_offline(now=heard + timedelta(seconds=TIMEOUT + 1)) == [node.pk]
    node_services.nodes_heartbeat(node_ids=[node.pk], at=heard + timedelta(seconds=TIMEOUT + GRACE - 5))
    assert node_services.nodes_lose_leases(now=heard + timedelta(seconds=TIMEOUT + GRACE + 30)) == []
    assert Node.objects.get(pk=node.pk).status == Node.Status.ONLINE
    assert Lease.objects.get(pk=lease.pk).state == Lease.State.RUNNING


def test_most_of_the_fleet_silent_at_once_is_the_platforms_outage_and_nobody_is_marked_until_the_grace_runs_out(
        fleet, caplog):
    a, b, c = fleet.node("l4:1"), fleet.node("l4:1"), fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = _running(fleet, buyer)
    heard = lease.billed_until
    for node in (a, b, c):
        _silent_since(node, heard)
    # Two of three silent (Redis went away, say): the platform is deaf, not the nodes.
    Node.objects.filter(pk=c.pk).update(last_heartbeat=heard + timedelta(seconds=TIMEOUT + 1))
    with caplog.at_level(logging.WARNING, logger="scheduler.services.nodes"):
        assert node_services.nodes_mark_offline(now=heard + timedelta(seconds=TIMEOUT + 1)) == []
    assert "2 of 3 live nodes fell silent at once" in caplog.text
    assert set(Node.objects.values_list("status", flat=True)) == {Node.Status.ONLINE}
    # One of three silent is that node's own silence.
    node_services.nodes_heartbeat(node_ids=[b.pk], at=heard + timedelta(seconds=TIMEOUT + 1))
    assert node_services.nodes_mark_offline(now=heard + timedelta(seconds=TIMEOUT + 1)) == [a.pk]
    # A mass silence longer than the grace is marked after all (and the leases of those nodes are lost).
    Node.objects.filter(pk=a.pk).update(status=Node.Status.ONLINE)
    _silent_since(b, heard)
    late = heard + timedelta(seconds=TIMEOUT + GRACE + 1)
    Node.objects.filter(pk=c.pk).update(last_heartbeat=late)
    assert sorted(node_services.nodes_mark_offline(now=late), key=str) == sorted([a.pk, b.pk], key=str)


def test_half_of_the_fleet_silent_at_once_is_the_platform_too(fleet):
    """The web process two of four agents were connected to lost its database connections: half the fleet went
    silent together; that is the platform's fault, not two nodes dying at the same second."""
    nodes = [fleet.node("l4:1") for _ in range(4)]
    now = timezone.now()
    for node in nodes[:2]:
        _silent_since(node, now - timedelta(seconds=TIMEOUT + 1))
    for node in nodes[2:]:
        _silent_since(node, now)
    assert node_services.nodes_mark_offline(now=now) == []
    assert set(Node.objects.values_list("status", flat=True)) == {Node.Status.ONLINE}
