"""The agent gateway over a real Channels communicator: auth, hello, metrics, commands, bad frames."""
from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from marketplace.consumers import ConsoleConsumer
from nodeagent import protocol
from scheduler.gateway.consumer import AgentConsumer
from scheduler.gateway.ingest import INGEST
from scheduler.models import AgentCommand, Gpu, GpuMetricLatest, GpuMetricRollup, HealthEvent, Node, Slice
from scheduler.services import slices as slice_services
from tests.agentframes import hello_from, metrics_from, sim_backend
from tests.factories import UserFactory, node_with_token

pytestmark = [pytest.mark.django_db(transaction=True)]


def agent(token: str | None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return WebsocketCommunicator(AgentConsumer.as_asgi(), "/ws/agent/", headers=headers)


async def connect_agent(token: str, backend) -> WebsocketCommunicator:
    comm = agent(token)
    connected, _ = await comm.connect()
    assert connected
    await comm.send_to(text_data=protocol.encode(hello_from(backend)))
    welcome = json.loads(await comm.receive_from(timeout=5))
    assert welcome["type"] == "welcome", welcome
    return comm


async def expect_close(comm, code: int) -> None:
    while True:
        out = await comm.receive_output(timeout=5)
        if out["type"] == "websocket.close":
            assert out.get("code") == code
            return


async def barrier(comm) -> None:
    """Frames are handled in order: once a deliberately bad frame is answered, all before it are done."""
    await comm.send_to(text_data="{")
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "error"


async def counts() -> tuple:
    @sync_to_async
    def _counts():
        return (Gpu.objects.count(), GpuMetricLatest.objects.count(), GpuMetricRollup.objects.count(),
                Slice.objects.count(), AgentCommand.objects.exclude(state="pending").count(),
                list(Node.objects.values_list("status", flat=True).order_by("pk")))
    return await _counts()


async def test_agent_with_an_unknown_token_gets_an_error_frame_and_a_4401_close():
    await sync_to_async(node_with_token)()
    comm = agent("gpm_node_not-a-real-token")
    connected, _ = await comm.connect()
    assert connected
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["type"] == "error" and err["code"] == protocol.E_UNAUTHORISED
    await expect_close(comm, 4401)


async def test_agent_without_a_token_is_closed_4401():
    comm = agent(None)
    await comm.connect()
    await comm.receive_from(timeout=5)
    await expect_close(comm, 4401)


async def test_hello_stores_the_inventory_and_geometry_the_agent_reports_and_brings_the_node_online():
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("h100-80gb:2,l4:1", hostname="n1")
    comm = await connect_agent(token, backend)

    @sync_to_async
    def check():
        node.refresh_from_db()
        assert node.status == Node.Status.ONLINE and node.hostname == "n1" and node.backend == "simulated"
        assert node.last_heartbeat is not None
        gpus = list(node.gpus.order_by("index"))
        assert [g.gpu_model.key for g in gpus] == ["h100-80gb", "h100-80gb", "l4"]
        assert gpus[0].mig_enabled and gpus[0].geometry().profile("3g.40gb").starts == (0, 4)
        assert not gpus[2].mig_enabled and gpus[2].geometry() is None
        assert HealthEvent.objects.filter(node=node, kind="connected").exists()
    await check()
    await comm.disconnect()


@pytest.mark.parametrize("payload, code", [
    ("{not json", protocol.E_BAD_FRAME),
    (json.dumps({"v": 99, "type": "metrics"}), protocol.E_VERSION),
    (json.dumps([1, 2]), protocol.E_BAD_FRAME),
    (json.dumps({"v": 1, "type": "metrics", "ts": 1.0, "gpus": [{"uuid": "x", "util": 500, "mem_used_mib": 1,
                                                                  "mem_total_mib": 2, "temp_c": 30, "power_w": 10}]}),
     protocol.E_BAD_FRAME),
    (json.dumps({"v": 1, "type": "welcome", "node_id": "x", "metrics_interval": 1, "heartbeat_timeout": 1}),
     protocol.E_BAD_FRAME),
    (json.dumps({"v": 1, "type": "result", "id": "abc", "ok": "yes"}), protocol.E_BAD_FRAME),
])
async def test_a_malformed_frame_gets_an_error_frame_and_changes_nothing(payload, code):
    node, token = await sync_to_async(node_with_token)()
    comm = await connect_agent(token, sim_backend(hostname="bad"))
    before = await counts()
    await comm.send_to(text_data=payload)
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["type"] == "error" and err["code"] == code, err
    await INGEST.flush()
    assert await counts() == before
    await comm.disconnect()


async def test_metrics_before_hello_are_refused_and_the_socket_closed():
    node, token = await sync_to_async(node_with_token)()
    comm = agent(token)
    await comm.connect()
    await comm.send_to(text_data=protocol.encode(metrics_from(sim_backend())))
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["type"] == "error" and "before hello" in err["message"]
    await expect_close(comm, 4400)
    assert (await counts())[:3] == (0, 0, 0)


async def test_metrics_naming_another_nodes_gpu_are_refused_and_nothing_of_the_batch_is_written():
    _, token_a = await sync_to_async(node_with_token)()
    _, token_b = await sync_to_async(node_with_token)()
    backend_a, backend_b = sim_backend(hostname="a"), sim_backend(hostname="b")
    comm_a = await connect_agent(token_a, backend_a)
    comm_b = await connect_agent(token_b, backend_b)
    await INGEST.flush()
    before = await counts()
    frame = metrics_from(backend_a)
    frame["gpus"] += backend_b.sample()[:1]  # a's own GPUs plus one of b's
    await comm_a.send_to(text_data=protocol.encode(frame))
    err = json.loads(await comm_a.receive_from(timeout=5))
    assert err["code"] == protocol.E_FORBIDDEN
    await INGEST.flush()
    assert await counts() == before
    await comm_a.disconnect()
    await comm_b.disconnect()


async def test_a_hello_claiming_another_nodes_gpu_is_refused_with_4403_and_writes_nothing():
    node_a, token_a = await sync_to_async(node_with_token)()
    node_b, token_b = await sync_to_async(node_with_token)()
    backend = sim_backend(hostname="same-machine")
    comm_a = await connect_agent(token_a, backend)
    comm_b = agent(token_b)
    await comm_b.connect()
    await comm_b.send_to(text_data=protocol.encode(hello_from(backend)))  # same GPU uuids as node a
    err = json.loads(await comm_b.receive_from(timeout=5))
    assert err["type"] == "error" and "another node" in err["message"]
    await expect_close(comm_b, 4403)

    @sync_to_async
    def check():
        node_b.refresh_from_db()
        assert node_b.status == Node.Status.PENDING and node_b.gpus.count() == 0
        assert Gpu.objects.filter(node=node_a).count() == 3
    await check()
    await comm_a.disconnect()


async def test_metrics_reach_a_subscribed_console_at_once_and_the_flush_writes_latest_values_and_rollups():
    provider = await sync_to_async(UserFactory)()
    node, token = await sync_to_async(node_with_token)(provider=provider)
    backend = sim_backend(hostname="m")
    comm = await connect_agent(token, backend)
    console = WebsocketCommunicator(ConsoleConsumer.as_asgi(), "/ws/console/")
    console.scope["user"] = provider
    assert (await console.connect())[0]
    await console.send_json_to({"subscribe": {"node": str(node.pk)}})
    assert (await console.receive_json_from(timeout=5))["type"] == "subscribed"

    frames = [metrics_from(backend) for _ in range(3)]
    for frame in frames:
        await comm.send_to(text_data=protocol.encode(frame))
        got = await console.receive_json_from(timeout=5)
        assert got["type"] == "metrics" and got["gpus"] == frame["gpus"]
    assert await INGEST.flush() == 3

    @sync_to_async
    def check():
        latest = {l.gpu.uuid: l for l in GpuMetricLatest.objects.select_related("gpu")}
        last = frames[-1]["gpus"]
        assert {g["uuid"] for g in last} == set(latest)
        assert latest[last[0]["uuid"]].temp_c == pytest.approx(last[0]["temp_c"])
        rollups = list(GpuMetricRollup.objects.all())
        assert rollups and sum(r.samples for r in rollups) == 9  # 3 batches × 3 GPUs
        g0 = [f["gpus"][0] for f in frames]
        r0 = next(r for r in rollups if r.gpu.uuid == g0[0]["uuid"] and r.samples == 3) if len(rollups) == 3 else None
        if r0 is not None:  # all three samples fell in one minute
            assert r0.temp_max == pytest.approx(max(g["temp_c"] for g in g0))
            assert r0.temp_min == pytest.approx(min(g["temp_c"] for g in g0))
            assert r0.temp_avg == pytest.approx(sum(g["temp_c"] for g in g0) / 3)
        node.refresh_from_db()
        assert node.last_heartbeat is not None
    await check()
    await console.disconnect()
    await comm.disconnect()


async def test_a_console_user_cannot_subscribe_to_another_providers_node():
    node, _ = await sync_to_async(node_with_token)()
    stranger = await sync_to_async(UserFactory)()
    console = WebsocketCommunicator(ConsoleConsumer.as_asgi(), "/ws/console/")
    console.scope["user"] = stranger
    await console.connect()
    await console.send_json_to({"subscribe": {"node": str(node.pk)}})
    reply = await console.receive_json_from(timeout=5)
    assert reply["type"] == "error"


async def test_create_instance_round_trip_makes_the_slice_ready_with_the_agents_mig_uuid():
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend(hostname="c")
    comm = await connect_agent(token, backend)
    gpu = await sync_to_async(lambda: Gpu.objects.get(node=node, index=0))()
    sl = await sync_to_async(slice_services.slice_create)(gpu_id=gpu.pk, profile="4g.40gb", start=0)
    cmd = json.loads(await comm.receive_from(timeout=5))
    assert cmd["type"] == "command" and cmd["op"] == "create_instance"
    assert cmd["args"] == {"gpu_uuid": gpu.uuid, "profile": "4g.40gb", "start": 0}
    result = backend.create_instance(**cmd["args"])
    await comm.send_to(text_data=protocol.encode(protocol.result_ok(id=cmd["id"], result=result)))
    # A repeated result (the agent resends after a reconnect) is harmless.
    await comm.send_to(text_data=protocol.encode(protocol.result_ok(id=cmd["id"], result=result)))
    await barrier(comm)

    @sync_to_async
    def check():
        sl.refresh_from_db()
        assert sl.state == Slice.State.READY and sl.instance_uuid.startswith("MIG-")
        assert sl.instance_uuid == result["instance_uuid"] == sl.cuda_visible_devices
        assert AgentCommand.objects.get(pk=cmd["id"]).state == AgentCommand.State.SUCCEEDED
    await check()
    await comm.disconnect()


async def test_a_result_for_another_nodes_command_changes_nothing():
    node_a, token_a = await sync_to_async(node_with_token)()
    node_b, token_b = await sync_to_async(node_with_token)()
    backend_a, backend_b = sim_backend(hostname="ra"), sim_backend(hostname="rb")
    comm_a = await connect_agent(token_a, backend_a)
    comm_b = await connect_agent(token_b, backend_b)
    gpu = await sync_to_async(lambda: Gpu.objects.get(node=node_a, index=0))()
    sl = await sync_to_async(slice_services.slice_create)(gpu_id=gpu.pk, profile="1g.10gb", start=0)
    cmd = json.loads(await comm_a.receive_from(timeout=5))
    fake = protocol.result_ok(id=cmd["id"], result={"instance_uuid": "MIG-forged"})
    await comm_b.send_to(text_data=protocol.encode(fake))
    await barrier(comm_b)

    @sync_to_async
    def check():
        sl.refresh_from_db()
        assert sl.state == Slice.State.CREATING and sl.instance_uuid == ""
    await check()
    await comm_a.disconnect()
    await comm_b.disconnect()


@pytest.mark.parametrize("fault, reason", [("overheat", "temperature"), ("power", "power"), ("ecc", "ECC"),
                                           ("xid", "XID")])
async def test_a_health_threshold_crossing_cordons_the_gpu(fault, reason):
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("a100-80gb:1", hostname=f"h-{fault}")
    comm = await connect_agent(token, backend)
    gpu_uuid = backend.inventory()["gpus"][0]["uuid"]
    backend.inject_fault(gpu_uuid, fault, **({"xid": 79} if fault == "xid" else {}))
    for _ in range(300):  # the simulated temperature climbs over some samples
        frame = metrics_from(backend)
        await comm.send_to(text_data=protocol.encode(frame))
        if await sync_to_async(lambda: Gpu.objects.get(uuid=gpu_uuid).health)() == Gpu.Health.CORDONED:
            break
    gpu = await sync_to_async(Gpu.objects.get)(uuid=gpu_uuid)
    assert gpu.health == Gpu.Health.CORDONED and reason in gpu.health_reason
    assert await sync_to_async(HealthEvent.objects.filter(gpu=gpu, kind="cordon").count)() == 1
    await comm.disconnect()


async def test_every_xid_an_agent_reports_is_recorded_by_code_and_rescores_the_gpu():
    """XID 45 does not cordon the GPU, but it is kept for the reliability score (health component, by code)."""
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("a100-80gb:1", hostname="h-xid-record")
    comm = await connect_agent(token, backend)
    gpu_uuid = backend.inventory()["gpus"][0]["uuid"]
    backend.inject_fault(gpu_uuid, "xid", xid=45)
    await comm.send_to(text_data=protocol.encode(metrics_from(backend)))
    await barrier(comm)
    events = await sync_to_async(lambda: list(HealthEvent.objects.filter(gpu__uuid=gpu_uuid, kind="xid")
                                              .values_list("detail", flat=True)))()
    assert events == [{"codes": [45]}]
    gpu = await sync_to_async(Gpu.objects.get)(uuid=gpu_uuid)
    assert gpu.health == Gpu.Health.HEALTHY and gpu.reliability is not None and gpu.reliability < 1.0
    await comm.disconnect()


async def test_a_command_issued_while_the_hello_is_being_applied_still_reaches_the_agent(monkeypatch):
    from scheduler.services import commands as command_services

    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("a100-80gb:1", hostname="race")
    await sync_to_async(lambda: __import__("scheduler.services.nodes", fromlist=["x"]).node_hello(
        node_id=node.pk, frame=hello_from(backend)))()
    gpu = await sync_to_async(lambda: Gpu.objects.get(node=node))()
    real_open_for = command_services.commands_open_for
    issued = []

    def open_for_then_a_new_command_commits(*, node_id):
        frames = real_open_for(node_id=node_id)
        # The race: an order carves a slice after the open commands were read, before the socket is
        # in the node's agent group; its after-commit send must not go to an empty group.
        issued.append(slice_services.slice_create(gpu_id=gpu.pk, profile="1g.10gb", start=0))
        return frames

    monkeypatch.setattr(command_services, "commands_open_for", open_for_then_a_new_command_commits)
    comm = await connect_agent(token, backend)
    cmd = json.loads(await comm.receive_from(timeout=5))
    assert cmd["type"] == "command" and cmd["op"] == "create_instance"
    assert await sync_to_async(lambda: str(AgentCommand.objects.get(slice=issued[0]).pk))() == cmd["id"]
    await comm.disconnect()


@pytest.mark.parametrize("reading, reason", [
    ({"ecc_dbe": 10**30}, "integer count"), ({"ecc_sbe": 1e300}, "integer count"), ({"ecc_sbe": 2.5}, "integer count"),
    ({"mem_used_mib": 30000, "mem_total_mib": 23034}, "mem_used_mib=30000 is more than mem_total_mib=23034"),
])
async def test_a_reading_the_database_cannot_hold_or_that_cannot_be_is_refused_and_later_metrics_are_written(
        reading, reason):
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("l4:1", hostname="poison")
    comm = await connect_agent(token, backend)
    frame = metrics_from(backend)
    frame["gpus"][0].update(reading)
    await comm.send_to(text_data=protocol.encode(frame))
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["type"] == "error" and err["code"] == protocol.E_BAD_FRAME and reason in err["message"]
    await INGEST.flush()  # one agent's bad number must not break every later flush
    good = metrics_from(backend)
    await comm.send_to(text_data=protocol.encode(good))
    await barrier(comm)
    assert await INGEST.flush() == 1
    latest = await sync_to_async(lambda: GpuMetricLatest.objects.get(gpu__node=node))()
    assert latest.temp_c == pytest.approx(good["gpus"][0]["temp_c"])
    await comm.disconnect()


async def test_a_gpu_repeated_in_one_metrics_batch_is_refused_so_it_is_not_counted_twice():
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("l4:1", hostname="twice")
    comm = await connect_agent(token, backend)
    frame = metrics_from(backend)
    frame["gpus"] = frame["gpus"] * 5
    await comm.send_to(text_data=protocol.encode(frame))
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["type"] == "error" and "repeated" in err["message"]
    await INGEST.flush()
    assert not await sync_to_async(GpuMetricRollup.objects.filter(gpu__node=node).exists)()
    await comm.disconnect()


@pytest.mark.parametrize("gpu_patch, instance", [
    ({"memory_mib": 1e300}, None),
    ({"uuid": "GPU-" + "x" * 200}, None),
    ({}, {"uuid": "MIG-" + "y" * 200, "profile": "1g.10gb", "start": 0}),
    ({}, {"uuid": "MIG-ok", "profile": "p" * 100, "start": 0}),
])
async def test_a_hello_with_values_the_database_cannot_hold_gets_an_error_frame_and_writes_nothing(gpu_patch, instance):
    node, token = await sync_to_async(node_with_token)()
    hello = hello_from(sim_backend("a100-80gb:1", hostname="big"))
    hello["gpus"][0].update(gpu_patch)
    if instance:
        hello["gpus"][0]["instances"] = [instance]
    comm = agent(token)
    await comm.connect()
    await comm.send_to(text_data=protocol.encode(hello))
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["type"] == "error" and err["code"] == protocol.E_BAD_FRAME
    assert (await counts())[0] == 0 and (await counts())[3] == 0
    await comm.disconnect()


async def test_rotating_a_node_token_disconnects_the_agent_that_is_using_the_old_one():
    from scheduler.services import nodes as node_services

    node, token = await sync_to_async(node_with_token)()
    comm = await connect_agent(token, sim_backend("l4:1", hostname="leaked"))
    await sync_to_async(node_services.node_rotate_token)(node=node)
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["type"] == "error" and err["code"] == protocol.E_UNAUTHORISED
    await expect_close(comm, 4401)


async def test_a_socket_opened_with_a_token_that_was_rotated_before_its_hello_is_refused():
    from scheduler.services import nodes as node_services

    node, token = await sync_to_async(node_with_token)()
    comm = agent(token)
    assert (await comm.connect())[0]
    await sync_to_async(node_services.node_rotate_token)(node=node)
    await comm.send_to(text_data=protocol.encode(hello_from(sim_backend("l4:1", hostname="late"))))
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["type"] == "error" and err["code"] == protocol.E_UNAUTHORISED
    await expect_close(comm, 4401)
    assert (await counts())[0] == 0


async def test_an_operators_uncordon_holds_across_an_agent_reconnect_until_new_ecc_errors_arrive():
    from scheduler.services import health as health_services

    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("a100-80gb:1", hostname="ecc")
    gpu_uuid = backend.inventory()["gpus"][0]["uuid"]
    comm = await connect_agent(token, backend)
    backend.inject_fault(gpu_uuid, "ecc")
    await comm.send_to(text_data=protocol.encode(metrics_from(backend)))
    await barrier(comm)
    await INGEST.flush()
    gpu = await sync_to_async(Gpu.objects.get)(uuid=gpu_uuid)
    assert gpu.health == Gpu.Health.CORDONED
    await sync_to_async(health_services.gpu_uncordon)(gpu_id=gpu.pk, by="op", source="operator")
    await comm.disconnect()
    comm = await connect_agent(token, backend)  # e.g. the web process restarted
    for _ in range(3):  # the same (volatile) count: nothing new happened to the memory
        await comm.send_to(text_data=protocol.encode(metrics_from(backend)))
    await barrier(comm)
    assert (await sync_to_async(Gpu.objects.get)(uuid=gpu_uuid)).health == Gpu.Health.HEALTHY
    backend.inject_fault(gpu_uuid, "ecc")  # a new error does cordon it again
    await comm.send_to(text_data=protocol.encode(metrics_from(backend)))
    await barrier(comm)
    assert (await sync_to_async(Gpu.objects.get)(uuid=gpu_uuid)).health == Gpu.Health.CORDONED
    await comm.disconnect()


async def test_a_newer_accepted_hello_closes_the_older_socket_of_the_same_node_with_4409():
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("l4:1", hostname="twice")
    first = await connect_agent(token, backend)  # e.g. a stale socket, or the same token on a second machine
    second = await connect_agent(token, backend)
    err = json.loads(await first.receive_from(timeout=5))
    assert err["type"] == "error" and err["code"] == protocol.E_REPLACED
    await expect_close(first, 4409)
    # The newer socket still speaks for the node.
    await second.send_to(text_data=protocol.encode(metrics_from(backend)))
    await barrier(second)
    assert INGEST.latest
    await INGEST.flush()
    assert (await counts())[1] == 1
    await second.disconnect()


async def test_a_refused_hello_does_not_close_the_socket_already_speaking_for_the_node():
    node, token = await sync_to_async(node_with_token)()
    other, other_token = await sync_to_async(node_with_token)()
    foreign = sim_backend("l4:1", hostname="theirs", seed=7)
    await (await connect_agent(other_token, foreign)).disconnect()
    good = await connect_agent(token, sim_backend("l4:1", hostname="mine"))
    bad = agent(token)
    assert (await bad.connect())[0]
    await bad.send_to(text_data=protocol.encode(hello_from(foreign)))  # claims the other node's GPU
    await expect_close(bad, 4403)
    await good.send_to(text_data="{")  # still open: it answers
    assert json.loads(await good.receive_from(timeout=5))["type"] == "error"
    assert await good.receive_nothing(timeout=0.2)
    await good.disconnect()


async def test_power_above_the_tdp_share_for_several_frames_in_a_row_cordons_the_gpu(settings):
    settings.FLEET = {**settings.FLEET, "POWER_CORDON_SHARE": 1.1, "POWER_CORDON_SAMPLES": 3}
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("l4:1", hostname="hot")  # the catalog's L4: 72 W TDP
    comm = await connect_agent(token, backend)

    async def send_power(watts):
        frame = metrics_from(backend)
        frame["gpus"][0]["power_w"] = watts
        await comm.send_to(text_data=protocol.encode(frame))
        await barrier(comm)
        return (await sync_to_async(Gpu.objects.get)(node_id=node.pk)).health

    assert [await send_power(w) for w in (80, 80, 60, 80, 80)] == [Gpu.Health.HEALTHY] * 5  # the streak broke
    assert await send_power(80) == Gpu.Health.CORDONED
    gpu = await sync_to_async(Gpu.objects.get)(node_id=node.pk)
    assert "power" in gpu.health_reason
    await comm.disconnect()
