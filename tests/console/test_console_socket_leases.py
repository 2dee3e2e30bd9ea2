"""The console socket after a lease ends: its GPU goes to the next tenant, so the former holder must not go
on seeing that GPU's readings, neither on a socket opened before the end nor by subscribing afterwards."""
from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from marketplace.lifecycle import leases
from marketplace.models import Lease
from scheduler.services.events import node_group
from tests.console.test_console_socket import console_for, running_lease

pytestmark = [pytest.mark.django_db(transaction=True)]


async def send_metrics(node, gpu_uuid) -> None:
    frame = {"type": "metrics", "node": str(node.pk), "ts": 1.0, "sent": 0.9, "gpus": [{"uuid": gpu_uuid, "util": 5}]}
    # Both shapes of the gateway's message: the decoded readings and the frame encoded once.
    await get_channel_layer().group_send(node_group(node.pk), {
        "type": "node.metrics", "node": str(node.pk), "ts": 1.0, "sent": 0.9, "gpus": frame["gpus"],
        "text": json.dumps(frame)})


@sync_to_async
def end_and_settle(lease):
    from nodeagent import protocol
    from scheduler.models import AgentCommand
    from scheduler.services.commands import command_complete

    leases.lease_end(lease_id=lease.pk)
    destroy = AgentCommand.objects.get(slice_id=lease.slice_id, op="destroy_instance")
    # The agent confirms the destroy: the lease is ended and the buyer told.
    command_complete(node_id=destroy.node_id, frame=protocol.result_ok(id=str(destroy.pk), result={}))
    assert Lease.objects.get(pk=lease.pk).state == Lease.State.ENDED


async def test_a_socket_watching_a_lease_stops_getting_its_gpus_readings_once_the_lease_has_ended():
    buyer, lease, node, mine, _ = await running_lease()
    console = await console_for(buyer)
    await console.send_json_to({"subscribe": {"lease": str(lease.pk)}})
    assert (await console.receive_json_from(timeout=5))["type"] == "subscribed"
    await send_metrics(node, mine)
    assert (await console.receive_json_from(timeout=5))["type"] == "metrics"
    await end_and_settle(lease)
    while True:  # the buyer's own market events (ending, ended) still arrive
        got = await console.receive_json_from(timeout=5)
        assert got["type"] == "market"
        if got["event"]["type"] == "lease_ended":
            break
    await send_metrics(node, mine)
    assert await console.receive_nothing(timeout=0.3)
    await console.disconnect()


async def test_an_ended_lease_cannot_be_subscribed_to():
    buyer, lease, node, mine, _ = await running_lease()
    await end_and_settle(lease)
    console = await console_for(buyer)
    await console.send_json_to({"subscribe": {"lease": str(lease.pk)}})
    reply = await console.receive_json_from(timeout=5)
    assert reply["type"] == "error"
    await send_metrics(node, mine)
    assert await console.receive_nothing(timeout=0.3)
    await console.disconnect()
