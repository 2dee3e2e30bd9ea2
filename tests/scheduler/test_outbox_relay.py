"""With the in-memory channel layer, worker and beat write channel messages to the outbox and the web
process relays them, so commands and events issued outside the web still reach agents and browsers."""
from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import transaction

from nodeagent import protocol
from scheduler.gateway.consumer import AgentConsumer
from scheduler.gateway.relay import RELAY, relay_once
from scheduler.models import Gpu, OutboxEvent
from scheduler.services import events
from scheduler.services import slices as slice_services
from tests.agentframes import hello_from, sim_backend
from tests.factories import node_with_token

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def as_worker(monkeypatch):
    monkeypatch.setattr(events, "USE_OUTBOX", True)
    # The test relays by hand (relay_once): the web process's background relay would race it.
    monkeypatch.setattr(RELAY, "ensure_running", lambda: None)


async def test_a_command_issued_in_a_worker_reaches_the_agent_through_the_relay(as_worker):
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("a100-80gb:1", hostname="outbox")
    comm = WebsocketCommunicator(AgentConsumer.as_asgi(), "/ws/agent/",
                                 headers=[(b"authorization", f"Bearer {token}".encode())])
    await comm.connect()
    await comm.send_to(text_data=protocol.encode(hello_from(backend)))
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "welcome"

    @sync_to_async
    def carve_in_worker():
        with transaction.atomic():
            gpu = Gpu.objects.get(node=node)
            return slice_services.slice_create(gpu_id=gpu.pk, profile="3g.40gb", start=0)
    await carve_in_worker()
    assert await sync_to_async(OutboxEvent.objects.count)() >= 1
    assert await comm.receive_nothing(timeout=0.2)  # nothing arrives until the web process relays

    assert await relay_once() >= 1
    frame = None
    while frame is None or frame["type"] != "command":
        frame = json.loads(await comm.receive_from(timeout=5))
    assert frame["op"] == "create_instance" and frame["args"]["start"] == 0
    assert await sync_to_async(OutboxEvent.objects.count)() == 0
    await comm.disconnect()


def test_without_the_worker_flag_messages_go_straight_to_the_layer():
    events.announce_node("n1", {"status": "online"})
    assert OutboxEvent.objects.count() == 0
