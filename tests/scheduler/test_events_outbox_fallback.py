"""A committed request never fails on the channel layer: what cannot be sent while the layer (Redis) is away waits
in the outbox, and the relay sends it once the layer is back."""
from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.test import override_settings
from redis.exceptions import ConnectionError as RedisConnectionError
from rest_framework.test import APIClient

from marketplace.models import Lease
from scheduler.gateway.relay import relay_once
from scheduler.models import OutboxEvent
from scheduler.services import events
from tests.e2e.livestack import free_port
from tests.factories import UserFactory
from tests.marketplace.marketsim import Fleet, top_up
from tests.redisserver import needs_redis_server, redis_server

pytestmark = pytest.mark.django_db(transaction=True)

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


class UnreachableLayer(InMemoryChannelLayer):
    """What channels-redis raises on every send while Redis restarts."""

    async def group_send(self, group, message):
        raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


def _listen(group: str) -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    return channel


def _received(channel: str, count: int) -> list[dict]:
    layer = get_channel_layer()
    return [async_to_sync(layer.receive)(channel) for _ in range(count)]


def test_ending_a_lease_while_the_layer_is_down_answers_200_and_its_events_follow_once_it_is_back():
    fleet = Fleet()
    node = fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "20")
    client = APIClient()
    client.force_authenticate(buyer)
    order = client.post("/api/v1/orders/", {"mode": "on_demand"}, format="json").json()
    fleet.play()
    lease_id = order["leases"][0]
    assert Lease.objects.get(pk=lease_id).state == Lease.State.RUNNING

    with override_settings(CHANNEL_LAYERS={"default": {"BACKEND": f"{__name__}.UnreachableLayer"}}):
        r = client.post(f"/api/v1/leases/{lease_id}/end/", format="json")
    assert r.status_code == 200, r.content
    waiting = list(OutboxEvent.objects.values_list("group", flat=True))
    assert events.buyer_group(buyer.pk) in waiting and events.node_group(node.pk) in waiting

    with override_settings(CHANNEL_LAYERS=IN_MEMORY):
        buyer_channel = _listen(events.buyer_group(buyer.pk))
        console_channel = _listen(events.node_group(node.pk))
        assert async_to_sync(relay_once)() == len(waiting)
        to_buyer = _received(buyer_channel, waiting.count(events.buyer_group(buyer.pk)))
        to_console = _received(console_channel, waiting.count(events.node_group(node.pk)))
    assert any(m["event"].get("lease") == lease_id for m in to_buyer)
    assert {m["type"] for m in to_console} == {"node.changed"}
    assert OutboxEvent.objects.count() == 0


@needs_redis_server
def test_with_redis_stopped_announcements_wait_in_the_outbox_and_the_relay_sends_them_after_its_restart():
    port = free_port()
    layers = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                          "CONFIG": {"hosts": [{"address": f"redis://127.0.0.1:{port}/0",
                                                "socket_connect_timeout": 1}]}}}
    with override_settings(CHANNEL_LAYERS=layers):
        with redis_server(port):
            events.announce_node("n-1", {"status": "online"})  # straight through while Redis is up
        assert OutboxEvent.objects.count() == 0

        events.announce_node("n-1", {"status": "draining"})  # Redis stopped: no exception, into the outbox
        assert list(OutboxEvent.objects.values_list("group", flat=True)) == [events.node_group("n-1")]
        with pytest.raises(RedisConnectionError):
            async_to_sync(relay_once)()
        assert OutboxEvent.objects.count() == 1  # what the layer did not take is kept

        with redis_server(port):
            channel = _listen(events.node_group("n-1"))
            assert async_to_sync(relay_once)() == 1
            [message] = _received(channel, 1)
    assert message == {"type": "node.changed", "node": "n-1", "change": {"status": "draining"}}
    assert OutboxEvent.objects.count() == 0


async def test_a_web_process_serving_only_http_relays_the_outbox():
    from channels.testing import HttpCommunicator

    from config.asgi import application
    from scheduler.gateway.relay import RELAY

    RELAY._task = None
    response = await HttpCommunicator(application, "GET", "/api/v1/offers/").get_response(timeout=20)
    assert response["status"] < 500
    assert RELAY._task is not None and not RELAY._task.done()
    RELAY._task.cancel()
