"""The console socket for buyers: a lease holder watches its lease's GPU (and only that GPU's readings);
nobody else may subscribe to the lease."""
from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from marketplace.consumers import ConsoleConsumer
from marketplace.models import Lease
from marketplace.products import orders
from marketplace.products.orders import OrderSpec
from scheduler.services.events import node_group
from tests.factories import UserFactory
from tests.marketplace.marketsim import Fleet, top_up

pytestmark = [pytest.mark.django_db(transaction=True)]


@sync_to_async
def running_lease():
    fleet = Fleet()
    node = fleet.node("h100-80gb:2")
    buyer = UserFactory()
    top_up(buyer, "50")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=10, duration_seconds=600))
    fleet.play()
    lease = Lease.objects.select_related("slice__gpu").get(order=order)
    other_gpu = node.gpus.exclude(pk=lease.slice.gpu_id).get().uuid
    return buyer, lease, node, lease.slice.gpu.uuid, other_gpu


async def console_for(user) -> WebsocketCommunicator:
    console = WebsocketCommunicator(ConsoleConsumer.as_asgi(), "/ws/console/")
    console.scope["user"] = user
    assert (await console.connect())[0]
    return console


async def test_a_lease_holder_sees_only_its_gpus_readings_and_a_stranger_cannot_subscribe():
    buyer, lease, node, mine, other = await running_lease()
    console = await console_for(buyer)
    await console.send_json_to({"subscribe": {"lease": str(lease.pk)}})
    reply = await console.receive_json_from(timeout=5)
    assert reply == {"type": "subscribed", "node": str(node.pk), "lease": str(lease.pk)}
    layer = get_channel_layer()
    frame = {"type": "metrics", "node": str(node.pk), "ts": 1.0, "sent": 0.9,
             "gpus": [{"uuid": mine, "util": 5}, {"uuid": other, "util": 9}]}
    await layer.group_send(node_group(node.pk), {"type": "node.metrics", "node": str(node.pk),
                                                 "text": json.dumps(frame)})
    got = await console.receive_json_from(timeout=5)
    assert got["type"] == "metrics" and [g["uuid"] for g in got["gpus"]] == [mine]
    # The node's own changes are its provider's business.
    await layer.group_send(node_group(node.pk), {"type": "node.changed", "node": str(node.pk),
                                                 "change": {"status": "draining"}})
    assert await console.receive_nothing(timeout=0.3)
    # Someone else's lease, or the node itself, is refused.
    stranger = await sync_to_async(UserFactory)()
    other_console = await console_for(stranger)
    for target in ({"lease": str(lease.pk)}, {"node": str(node.pk)}, {"lease": "not-a-uuid"}, {}):
        await other_console.send_json_to({"subscribe": target})
        assert (await other_console.receive_json_from(timeout=5))["type"] == "error"
    await console.disconnect()
    await other_console.disconnect()
