"""The agent gateway under the fuzzer's findings: which socket speaks for a node when several race, hellos
rate-limited, nothing sent after a close, unsupported versions closed, reports that make no sense refused, and
a truthful connection history."""
from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from marketplace.consumers import ConsoleConsumer
from nodeagent import protocol
from scheduler.gateway.consumer import AgentConsumer
from scheduler.models import AgentCommand, Gpu, HealthEvent, Node
from scheduler.services import nodes as node_services, slices as slice_services
from scheduler.services.events import agent_group
from tests.agentframes import hello_from, metrics_from, sim_backend
from tests.factories import UserFactory, node_with_token
from tests.scheduler.test_gateway import agent, barrier, connect_agent, expect_close

pytestmark = [pytest.mark.django_db(transaction=True)]


def socket_of(consumer_class, token: str) -> WebsocketCommunicator:
    return WebsocketCommunicator(consumer_class.as_asgi(), "/ws/agent/",
                                 headers=[(b"authorization", f"Bearer {token}".encode())])


async def wait_for(predicate, what: str, timeout: float = 5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if result := await predicate():
            return result
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def outputs_until_quiet(comm) -> list[dict]:
    out = []
    while not await comm.receive_nothing(timeout=0.3):
        out.append(await comm.receive_output(timeout=1))
    return out


async def node_state(node_id) -> tuple:
    node = await sync_to_async(Node.objects.get)(pk=node_id)
    return node.status, node.agent_session


async def connection_events(node_id) -> list[tuple[str, dict]]:
    return await sync_to_async(lambda: [
        (e.kind, e.detail) for e in HealthEvent.objects.filter(
            node_id=node_id, kind__in=["connected", "reconnected", "disconnected", "replaced"]).order_by("pk")])()


# --- which socket speaks for the node ------------------------------------------------------------------

async def test_an_older_sockets_backlogged_hello_applied_after_a_newer_one_is_refused_and_the_newer_keeps_the_node():
    """The interleaving that left a node offline: the older socket's hello is handled (its backlog) after
    the newer socket's hello was accepted and before the newer one's announcement reaches it. Before, the
    late hello won and announced itself, the newer socket closed 4409, then the older one yielded too."""
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("l4:1", hostname="twice")
    gate = asyncio.Event()

    class Backlogged(AgentConsumer):
        async def _hello(self, frame):
            if self.ready:  # its second hello: held as if a backlog of frames were ahead of it
                await gate.wait()
            await super()._hello(frame)

    older = socket_of(Backlogged, token)
    assert (await older.connect())[0]
    await older.send_to(text_data=protocol.encode(hello_from(backend)))
    assert json.loads(await older.receive_from(timeout=5))["type"] == "welcome"
    await older.send_to(text_data=protocol.encode(hello_from(backend)))  # waits at the gate
    newer = await connect_agent(token, backend)  # accepted; its announcement queues behind the held hello
    gate.set()

    err = json.loads(await older.receive_from(timeout=5))
    assert err["type"] == "error" and err["code"] == protocol.E_REPLACED, err
    await expect_close(older, 4409)
    assert await newer.receive_nothing(timeout=0.3)  # not replaced by the refused hello
    await newer.send_to(text_data=protocol.encode(metrics_from(backend)))
    await barrier(newer)  # still answering: open and speaking for the node
    status, session = await node_state(node.pk)
    assert status == Node.Status.ONLINE and session == 2
    await newer.disconnect()
    await older.disconnect()


async def test_a_socket_that_authenticated_first_cannot_take_over_with_a_hello_that_comes_last():
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("l4:1", hostname="slow-first")
    older = agent(token)
    assert (await older.connect())[0]  # session 1, its hello delayed (e.g. the agent gave up waiting)
    newer = await connect_agent(token, backend)  # session 2, accepted
    await older.send_to(text_data=protocol.encode(hello_from(backend)))
    err = json.loads(await older.receive_from(timeout=5))
    assert err["code"] == protocol.E_REPLACED and "newer connection" in err["message"]
    await expect_close(older, 4409)
    await barrier(newer)
    assert await node_state(node.pk) == (Node.Status.ONLINE, 2)
    await newer.disconnect()


async def test_a_late_announcement_from_an_older_session_does_not_close_the_newer_socket():
    node, token = await sync_to_async(node_with_token)()
    comm = await connect_agent(token, sim_backend("l4:1", hostname="late"))
    await comm.send_to(text_data=protocol.encode(hello_from(sim_backend("l4:1", hostname="late"))))
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "welcome"  # a re-hello of its own session
    # What an older socket in another web process announces after its own (refused or superseded) hello.
    await get_channel_layer().group_send(agent_group(node.pk), {"type": "agent.replaced", "by": "elsewhere",
                                                                "session": 0})
    await barrier(comm)
    assert await comm.receive_nothing(timeout=0.2)
    await comm.disconnect()


# --- hellos are rate-limited ----------------------------------------------------------------------------

async def test_hellos_over_the_rate_are_refused_and_dropped_and_a_flood_closes_the_socket(settings, monkeypatch):
    settings.FLEET = {**settings.FLEET, "AGENT_HELLO_RATE": 0.001, "AGENT_HELLO_BURST": 2,
                      "AGENT_MAX_DROPPED": 3, "AGENT_DROP_WINDOW_SECONDS": 60}
    applied = []
    real = node_services.node_hello
    monkeypatch.setattr(node_services, "node_hello", lambda **kw: applied.append(1) or real(**kw))
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("l4:1", hostname="hellos")
    comm = await connect_agent(token, backend)  # the first of the burst of 2
    hello = protocol.encode(hello_from(backend))
    await comm.send_to(text_data=hello)
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "welcome"
    await comm.send_to(text_data=hello)
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["code"] == protocol.E_RATE_LIMITED and "hello" in err["message"]
    assert len(applied) == 2  # the dropped hello wrote nothing
    for _ in range(3):  # past AGENT_MAX_DROPPED within the window
        await comm.send_to(text_data=hello)
    await expect_close(comm, 4400)
    assert len(applied) == 2


# --- close discipline -----------------------------------------------------------------------------------

async def test_an_unsupported_protocol_version_is_refused_and_closed_with_4400_at_once():
    node, token = await sync_to_async(node_with_token)()
    comm = await connect_agent(token, sim_backend("l4:1", hostname="v2"))
    await comm.send_to(text_data=json.dumps({"v": 2, "type": "metrics", "ts": 1.0, "gpus": []}))
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["code"] == protocol.E_VERSION
    await expect_close(comm, 4400)


async def test_after_closing_a_socket_the_gateway_sends_nothing_more_and_applies_nothing_more():
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("a100-80gb:1", hostname="closed")
    handled = []

    class Recording(AgentConsumer):
        async def dispatch(self, message):
            await super().dispatch(message)
            handled.append(message["type"])

    comm = socket_of(Recording, token)
    assert (await comm.connect())[0]
    await comm.send_to(text_data=protocol.encode(hello_from(backend)))
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "welcome"
    # The close, then frames already read behind it: another bad frame, a hello, metrics.
    await comm.send_to(text_data=json.dumps({"v": 2, "type": "hello"}))
    await comm.send_to(text_data="{")
    await comm.send_to(text_data=protocol.encode(hello_from(backend)))
    await comm.send_to(text_data=protocol.encode(metrics_from(backend)))
    # Channel-layer messages arriving after the close: a command, a token rotation, a newer socket, a resync.
    gpu = await sync_to_async(Gpu.objects.get)(node=node)
    sl = await sync_to_async(slice_services.slice_create)(gpu_id=gpu.pk, profile="1g.10gb", start=0)
    await sync_to_async(node_services.node_rotate_token)(node=node)
    layer = get_channel_layer()
    await layer.group_send(agent_group(node.pk), {"type": "agent.replaced", "by": "x", "session": 99})
    await layer.group_send(agent_group(node.pk), {"type": "agent.resync", "gpu_uuid": gpu.uuid})
    await wait_for(lambda: sync_to_async(lambda: handled.count("websocket.receive") == 5
                                         and {"agent.command", "agent.revoked", "agent.replaced",
                                              "agent.resync"} <= set(handled))(), "every message handled")
    out = await outputs_until_quiet(comm)
    kinds = [o["type"] for o in out]
    assert kinds == ["websocket.send", "websocket.close"], out  # the version error, then the close: nothing after
    assert out[1]["code"] == 4400
    cmd = await sync_to_async(AgentCommand.objects.get)(slice=sl)
    assert cmd.state == AgentCommand.State.PENDING and cmd.sent_at is None  # not sent: open for the next session
    assert not await sync_to_async(HealthEvent.objects.filter(node=node, kind="replaced").exists)()
    await comm.disconnect()


# --- connection history ---------------------------------------------------------------------------------

async def test_a_closed_agent_socket_writes_a_disconnected_event_with_its_close_code():
    node, token = await sync_to_async(node_with_token)()
    comm = await connect_agent(token, sim_backend("l4:1", hostname="bye"))
    await comm.disconnect(code=1001)
    events = await connection_events(node.pk)
    assert [k for k, _ in events] == ["connected", "disconnected"]
    assert events[1][1] == {"code": 1001, "reason": "", "by": "agent"}


async def test_a_socket_the_server_closes_records_the_servers_code_and_reason():
    node, token = await sync_to_async(node_with_token)()
    comm = await connect_agent(token, sim_backend("l4:1", hostname="v3"))
    await comm.send_to(text_data=json.dumps({"v": 3, "type": "metrics"}))
    await expect_close(comm, 4400)
    await comm.disconnect(code=4400)  # the client's answer to the close
    events = await connection_events(node.pk)
    assert events[-1] == ("disconnected", {"code": 4400, "reason": "bad frames", "by": "server"})
    message = await sync_to_async(lambda: HealthEvent.objects.filter(node=node).order_by("pk").last().message)()
    assert message == "agent socket closed (by the server, code 4400: bad frames)"


async def test_a_quick_reconnect_is_one_reconnected_event_and_pushes_no_status_to_consoles():
    provider = await sync_to_async(UserFactory)()
    node, token = await sync_to_async(node_with_token)(provider=provider)
    backend = sim_backend("l4:1", hostname="blip")
    console = WebsocketCommunicator(ConsoleConsumer.as_asgi(), "/ws/console/")
    console.scope["user"] = provider
    assert (await console.connect())[0]
    await console.send_json_to({"subscribe": {"node": str(node.pk)}})
    assert (await console.receive_json_from(timeout=5))["type"] == "subscribed"
    comm = await connect_agent(token, backend)
    assert (await console.receive_json_from(timeout=5))["change"] == {"status": "online"}  # pending -> online
    for _ in range(3):  # the channel layer's timeouts dropped sockets every few seconds
        await comm.disconnect(code=1011)
        comm = await connect_agent(token, backend)
    events = await connection_events(node.pk)
    assert [k for k, _ in events] == ["connected", "reconnected", "reconnected", "reconnected"]
    assert events[1][1]["code"] == 1011 and events[1][1]["reconnected_after_seconds"] >= 0
    assert await console.receive_nothing(timeout=0.3)  # it was online all along: nothing to tell
    await comm.disconnect()
    await console.disconnect()


async def test_a_reconnect_after_the_window_keeps_the_disconnected_event_and_writes_connected():
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("l4:1", hostname="later")
    comm = await connect_agent(token, backend)
    await comm.disconnect()
    window = node_services.RECONNECT_WINDOW_SECONDS
    await sync_to_async(lambda: HealthEvent.objects.filter(node=node, kind="disconnected").update(
        created_at=HealthEvent.objects.get(node=node, kind="disconnected").created_at
        - timedelta(seconds=window + 1)))()
    comm = await connect_agent(token, backend)
    assert [k for k, _ in await connection_events(node.pk)] == ["connected", "disconnected", "connected"]
    await comm.disconnect()


async def test_a_replaced_socket_or_a_refused_hello_writes_no_disconnected_event():
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("l4:1", hostname="taken")
    first = await connect_agent(token, backend)
    second = await connect_agent(token, backend)
    await expect_close(first, 4409)
    await first.disconnect(code=4409)
    late = agent(token)
    assert (await late.connect())[0]
    await late.disconnect()  # authenticated, never said hello
    assert [k for k, _ in await connection_events(node.pk)] == ["connected", "connected", "replaced"]
    await second.disconnect()
    assert [k for k, _ in await connection_events(node.pk)][-1] == "disconnected"


async def test_a_socket_dropped_by_a_failing_handler_still_records_that_it_closed(monkeypatch):
    from scheduler.services import commands as command_services

    def broken(**kwargs):
        raise ConnectionError("the channel layer or a service failed")

    monkeypatch.setattr(command_services, "command_complete", broken)
    node, token = await sync_to_async(node_with_token)()
    comm = await connect_agent(token, sim_backend("l4:1", hostname="crash"))
    await comm.send_to(text_data=protocol.encode(protocol.result_ok(id="c-1", result={})))
    with pytest.raises(ConnectionError):
        await comm.receive_output(timeout=5)
    events = await connection_events(node.pk)
    assert events[-1] == ("disconnected", {"code": 1011, "reason": "server error", "by": "server"})


# --- what the agent reports must make sense -------------------------------------------------------------

@pytest.mark.parametrize("patch, reason", [
    ({"cuda_version": "12.4-custom"}, "'cuda_version' must be a version of digits and dots"),
    ({"driver_version": "x" * 30}, "'driver_version' must be a version of digits and dots"),
    ({"gpu": {"model": "h100-80gb", "memory_mib": 23034}}, "says model h100-80gb (80 GB) but reports 23034 MiB"),
    ({"gpu": {"model": "h200-141gb"}}, "says model h200-141gb but its name 'NVIDIA H100-80GB' is H100-80GB"),
])
async def test_a_hello_with_versions_or_a_gpu_model_that_make_no_sense_gets_the_reason_and_writes_nothing(
        patch, reason):
    node, token = await sync_to_async(node_with_token)()
    hello = hello_from(sim_backend("h100-80gb:1", hostname="odd"))
    hello["gpus"][0].update(patch.pop("gpu", {}))
    hello.update(patch)
    comm = agent(token)
    assert (await comm.connect())[0]
    await comm.send_to(text_data=protocol.encode(hello))
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["type"] == "error" and err["code"] == protocol.E_BAD_FRAME and reason in err["message"], err
    assert not await sync_to_async(Gpu.objects.filter(node=node).exists)()
    await comm.disconnect()

