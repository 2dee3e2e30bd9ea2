"""Live notices: a buyer's console socket hears its leases and interruptions; the webhook gets a POST; a
webhook that fails is logged and changes nothing."""
from __future__ import annotations

import json
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from marketplace import events as notify
from marketplace.consumers import ConsoleConsumer
from marketplace.lifecycle import leases
from marketplace.models import Interruption, Lease
from marketplace.products import orders
from marketplace.products.orders import OrderSpec
from tests.factories import UserFactory
from tests.webhookserver import Hook
from tests.marketplace.marketsim import Fleet, top_up

pytestmark = [pytest.mark.django_db(transaction=True)]


async def next_market_event(comm, kind: str) -> dict:
    while True:
        msg = json.loads(await comm.receive_from(timeout=5))
        if msg["type"] == "market" and msg["event"]["type"] == kind:
            return msg["event"]


async def test_a_spot_interruption_reaches_the_buyers_socket_and_webhook_and_not_another_user(hook_url):
    fleet = Fleet()
    buyer, stranger = await sync_to_async(UserFactory)(), await sync_to_async(UserFactory)()

    def setup():
        fleet.node("l4:1", price="1.00")
        top_up(buyer, "10")
        order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="spot", max_price_per_hour=Decimal("1.0"),
                                                               webhook_url=hook_url))
        return Lease.objects.get(order=order)
    lease = await sync_to_async(setup)()
    comm = WebsocketCommunicator(ConsoleConsumer.as_asgi(), "/ws/console/")
    comm.scope["user"] = buyer
    other = WebsocketCommunicator(ConsoleConsumer.as_asgi(), "/ws/console/")
    other.scope["user"] = stranger
    assert (await comm.connect())[0] and (await other.connect())[0]
    await sync_to_async(leases.lease_interrupt)(lease_id=lease.pk, kind="preempted")
    event = await next_market_event(comm, "interruption")
    assert event["lease"] == str(lease.pk) and event["kind"] == "preempted" and event["notice_seconds"] == 120
    assert await other.receive_nothing(timeout=0.3)
    assert Hook.received and Hook.received[0][0] == "application/json"
    assert Hook.received[0][1]["lease"] == str(lease.pk) and Hook.received[0][1]["deadline"] == event["deadline"]
    await comm.disconnect()
    await other.disconnect()


def test_a_failing_webhook_is_logged_and_returns_false(caplog, settings):
    settings.WEBHOOKS_ALLOW_LOOPBACK = True  # loopback is allowed: what fails here is the connection, not the address check
    assert notify.webhook_post(url="http://127.0.0.1:9/nothing-listens", payload={"x": 1}, timeout=0.5) is False
    assert "webhook" in caplog.text


def test_a_lease_interrupted_without_full_notice_is_credited_once():
    fleet = Fleet()
    fleet.node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "10")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="spot", max_price_per_hour=Decimal("1.0")))
    lease = Lease.objects.get(order=order)
    from django.utils import timezone

    now = timezone.now()
    leases.lease_interrupt(lease_id=lease.pk, kind="preempted", now=now, deadline=now)
    assert leases.lease_interrupt(lease_id=lease.pk, kind="preempted", now=now) is None  # once
    intr = Interruption.objects.get(lease=lease)
    assert intr.notice_seconds == 0 and intr.credited == Decimal("0.50")  # an hour of spot at 0.5 x base
