"""Fleet services on the database: registration, slices under the geometry, offline, commands, health."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from nodeagent import protocol
from scheduler.errors import Conflict, DomainError
from scheduler.models import AgentCommand, Gpu, HealthEvent, Node, Slice
from scheduler.services import commands as command_services
from scheduler.services import health as health_services
from scheduler.services import nodes as node_services
from scheduler.services import slices as slice_services
from scheduler.services.tokens import token_hash
from tests.agentframes import hello_from, sim_backend
from tests.factories import ProviderFactory, UserFactory, node_with_token

pytestmark = pytest.mark.django_db


def online_node(spec="a100-80gb:1,l4:1", hostname="h"):
    node, token = node_with_token()
    node_services.node_hello(node_id=node.pk, frame=hello_from(sim_backend(spec, hostname=hostname)))
    node.refresh_from_db()
    return node


def test_a_registered_node_keeps_only_the_hash_of_its_token():
    node, token = node_with_token()
    assert token.startswith("gpm_node_") and len(token) > 40
    assert node.token_hash == token_hash(token) and token not in node.token_hash
    assert node_services.node_for_token(token=token) == node
    assert node_services.node_for_token(token=token + "x") is None


def test_rotating_a_token_stops_the_old_one():
    node, old = node_with_token()
    new = node_services.node_rotate_token(node=node)
    assert node_services.node_for_token(token=old) is None
    assert node_services.node_for_token(token=new) == node


@pytest.mark.parametrize("kwargs, field", [
    ({"name": ""}, "name"), ({"name": "x" * 81}, "name"), ({"name": "ok", "region": ""}, "region"),
    ({"name": "ok", "price_per_gpu_hour": "-1"}, "price_per_gpu_hour"),
    ({"name": "ok", "price_per_gpu_hour": "abc"}, "price_per_gpu_hour"),
])
def test_registration_refuses_bad_input_and_writes_nothing(kwargs, field):
    user = ProviderFactory()
    with pytest.raises(DomainError) as err:
        node_services.node_register(provider=user, **kwargs)
    assert err.value.field == field
    assert Node.objects.count() == 0


def test_the_same_provider_cannot_register_two_nodes_with_one_name():
    user = ProviderFactory()
    node_services.node_register(provider=user, name="rack1")
    with pytest.raises(Conflict):
        node_services.node_register(provider=user, name="rack1")
    assert Node.objects.count() == 1


def test_a_slice_claims_a_legal_placement_and_refuses_an_overlap_with_the_geometrys_reason():
    node = online_node()
    gpu = node.gpus.get(index=0)
    a = slice_services.slice_create(gpu_id=gpu.pk, profile="4g.40gb", start=0)
    b = slice_services.slice_create(gpu_id=gpu.pk, profile="3g.40gb", start=4)
    assert (a.state, b.state) == (Slice.State.CREATING, Slice.State.CREATING)
    with pytest.raises(Conflict) as err:
        slice_services.slice_create(gpu_id=gpu.pk, profile="3g.40gb", start=0)
    assert "overlaps" in err.value.message
    with pytest.raises(Conflict, match="no legal placement"):
        slice_services.slice_create(gpu_id=gpu.pk, profile="1g.10gb")
    assert Slice.objects.filter(gpu=gpu).count() == 2
    assert AgentCommand.objects.filter(node=node, op="create_instance").count() == 2


def test_a_slice_without_a_start_takes_the_first_legal_one():
    node = online_node()
    gpu = node.gpus.get(index=0)
    slice_services.slice_create(gpu_id=gpu.pk, profile="3g.40gb", start=0)
    assert slice_services.slice_create(gpu_id=gpu.pk, profile="3g.40gb").start == 4


@pytest.mark.parametrize("setup, code", [
    (lambda node, gpu: Node.objects.filter(pk=node.pk).update(status=Node.Status.OFFLINE), "node_unavailable"),
    (lambda node, gpu: Node.objects.filter(pk=node.pk).update(status=Node.Status.DRAINING), "node_unavailable"),
    (lambda node, gpu: health_services.gpu_cordon(gpu_id=gpu.pk, reason="test"), "gpu_cordoned"),
])
def test_no_slice_is_carved_on_an_unavailable_node_or_a_cordoned_gpu(setup, code):
    node = online_node()
    gpu = node.gpus.get(index=0)
    setup(node, gpu)
    with pytest.raises(Conflict) as err:
        slice_services.slice_create(gpu_id=gpu.pk, profile="1g.10gb", start=0)
    assert err.value.code == code
    assert not Slice.objects.exists()


def test_a_whole_non_mig_gpu_is_ready_at_once_and_a_mig_gpu_is_taken_whole_as_its_full_profile():
    node = online_node()
    l4 = node.gpus.get(index=1)
    whole = slice_services.slice_create(gpu_id=l4.pk, profile=None)
    assert whole.state == Slice.State.READY and whole.cuda_visible_devices == l4.uuid
    a100 = node.gpus.get(index=0)
    full = slice_services.slice_create(gpu_id=a100.pk, profile=None)
    assert (full.profile, full.start, full.size) == ("7g.80gb", 0, 8)
    with pytest.raises(DomainError):
        slice_services.slice_create(gpu_id=l4.pk, profile="1g.10gb", start=0)


def _result(cmd, ok=True, **result):
    if ok:
        return protocol.result_ok(id=str(cmd.id), result=result)
    return protocol.result_error(id=str(cmd.id), code=result["code"], message=result["message"])


def test_a_failed_create_releases_the_memory_slices():
    node = online_node()
    gpu = node.gpus.get(index=0)
    sl = slice_services.slice_create(gpu_id=gpu.pk, profile="7g.80gb", start=0)
    cmd = AgentCommand.objects.get(slice=sl)
    command_services.command_complete(node_id=node.pk, frame=_result(cmd, ok=False, code="insufficient_resources",
                                                                     message="In use by another client"))
    sl.refresh_from_db()
    assert sl.state == Slice.State.FAILED and "insufficient_resources" in sl.error
    assert slice_services.slice_create(gpu_id=gpu.pk, profile="7g.80gb", start=0).state == Slice.State.CREATING


def test_destroying_a_ready_slice_asks_the_agent_and_frees_it_on_confirmation():
    node = online_node()
    gpu = node.gpus.get(index=0)
    sl = slice_services.slice_create(gpu_id=gpu.pk, profile="2g.20gb", start=2)
    command_services.command_complete(node_id=node.pk, frame=_result(AgentCommand.objects.get(slice=sl),
                                                                     instance_uuid="MIG-abc"))
    slice_services.slice_destroy(slice_id=sl.pk)
    sl.refresh_from_db()
    assert sl.state == Slice.State.DESTROYING
    destroy = AgentCommand.objects.get(slice=sl, op="destroy_instance")
    assert destroy.args == {"gpu_uuid": gpu.uuid, "instance_uuid": "MIG-abc"}
    command_services.command_complete(node_id=node.pk, frame=_result(destroy, ok=True))
    sl.refresh_from_db()
    assert sl.state == Slice.State.DESTROYED and sl.ended_at is not None


def test_commands_past_their_deadline_time_out_and_fail_their_slice():
    node = online_node()
    gpu = node.gpus.get(index=0)
    sl = slice_services.slice_create(gpu_id=gpu.pk, profile="1g.10gb", start=3)
    assert command_services.commands_expire(now=timezone.now()) == 0
    assert command_services.commands_expire(now=timezone.now() + timedelta(hours=1)) == 1
    sl.refresh_from_db()
    assert sl.state == Slice.State.FAILED
    assert AgentCommand.objects.get(slice=sl).state == AgentCommand.State.TIMED_OUT


def test_nodes_silent_past_the_heartbeat_timeout_go_offline_and_come_back_when_heard(settings):
    settings.FLEET = {**settings.FLEET, "HEARTBEAT_TIMEOUT_SECONDS": 10}
    fresh, stale = online_node(hostname="fresh"), online_node(hostname="stale")
    now = timezone.now()
    Node.objects.filter(pk=stale.pk).update(last_heartbeat=now - timedelta(seconds=11))
    Node.objects.filter(pk=fresh.pk).update(last_heartbeat=now - timedelta(seconds=9))
    assert node_services.nodes_mark_offline(now=now) == [stale.pk]
    assert Node.objects.get(pk=stale.pk).status == Node.Status.OFFLINE
    assert Node.objects.get(pk=fresh.pk).status == Node.Status.ONLINE
    assert HealthEvent.objects.filter(node=stale, kind="offline").count() == 1
    node_services.nodes_heartbeat(node_ids=[stale.pk], at=now)
    assert Node.objects.get(pk=stale.pk).status == Node.Status.ONLINE


def _simulated_node_carving(*, start: int):
    """A node whose agent is a simulated A100 (said hello), with a 3g.40gb slice at `start` being carved."""
    node, _ = node_with_token()
    backend = sim_backend("a100-80gb:1", hostname="r")
    node_services.node_hello(node_id=node.pk, frame=hello_from(backend))
    gpu = node.gpus.get()
    return node, backend, gpu, slice_services.slice_create(gpu_id=gpu.pk, profile="3g.40gb", start=start)


def test_a_reconnecting_agent_adopts_instances_made_on_the_host_and_fails_slices_that_vanished():
    node, backend, gpu, sl = _simulated_node_carving(start=0)
    command_services.command_complete(node_id=node.pk, frame=_result(AgentCommand.objects.get(slice=sl),
                                                                     instance_uuid="MIG-gone"))
    made_by_hand = backend.create_instance(gpu.uuid, "3g.40gb", 4)
    node_services.node_hello(node_id=node.pk, frame=hello_from(backend))
    sl.refresh_from_db()
    assert sl.state == Slice.State.FAILED
    adopted = Slice.objects.get(instance_uuid=made_by_hand["instance_uuid"])
    assert (adopted.profile, adopted.start, adopted.state) == ("3g.40gb", 4, Slice.State.READY)


def test_an_instance_carved_before_the_agent_died_is_its_slice_not_an_adopted_one_and_its_create_is_not_resent():
    node, backend, gpu, sl = _simulated_node_carving(start=4)
    create = AgentCommand.objects.get(slice=sl)
    command_services.commands_mark_sent(command_ids=[create.pk], at=timezone.now())
    # The agent carved it and died before answering; its restarted self reports the instance.
    carved = backend.create_instance(gpu.uuid, "3g.40gb", 4)
    node_services.node_hello(node_id=node.pk, frame=hello_from(backend))
    sl.refresh_from_db()
    create.refresh_from_db()
    assert (sl.state, sl.instance_uuid) == (Slice.State.READY, carved["instance_uuid"])
    assert create.state == AgentCommand.State.SUCCEEDED
    assert command_services.commands_open_for(node_id=node.pk) == []
    assert Slice.objects.filter(gpu=gpu, state__in=Slice.ACTIVE_STATES).count() == 1
    # The first agent's late answer (had it survived) changes nothing.
    assert command_services.command_complete(node_id=node.pk, frame=_result(create, instance_uuid="MIG-x")) is None


@pytest.mark.parametrize("sample, previous_dbe, expect", [
    ({"temp_c": 89.9}, None, []),
    ({"temp_c": 90}, None, ["temperature"]),
    ({"ecc_dbe": 0}, None, []),
    ({"ecc_dbe": 2}, None, ["ECC"]),
    ({"ecc_dbe": 2}, 2, []),  # no new errors since the operator's uncordon
    ({"ecc_dbe": 3}, 2, ["ECC"]),
    ({"xid": [13]}, None, []),  # graphics engine exception: an application error, not the GPU's
    ({"xid": [79]}, None, ["XID"]),
    ({"temp_c": 95, "xid": [48]}, None, ["temperature", "XID"]),
])
def test_health_thresholds_decide_what_cordons_a_gpu(sample, previous_dbe, expect):
    thresholds = health_services.Thresholds(90.0, 0, frozenset({48, 79}))
    reasons = health_services.sample_violations(sample, thresholds, previous_dbe=previous_dbe)
    assert len(reasons) == len(expect)
    assert all(keyword in reason for keyword, reason in zip(expect, reasons))


@pytest.mark.parametrize("sample, tdp_w, samples_over_before, expect_over, expect", [
    ({"power_w": 770}, 700, 4, False, []),          # exactly 1.1 x TDP is not above it
    ({"power_w": 771}, 700, 3, True, []),           # the 4th sample in a row: not yet
    ({"power_w": 771}, 700, 4, True, ["power"]),    # the 5th in a row cordons
    ({"power_w": 771}, 700, 9, True, ["power"]),
    ({"power_w": 700}, 700, 9, False, []),          # back under: the streak is broken
    ({"power_w": None}, 700, 9, False, []),         # no reading is no evidence
    ({"power_w": 5000}, None, 9, False, []),        # a model the catalog does not know: no TDP to compare
    ({"power_w": 900, "temp_c": 95}, 700, 4, True, ["temperature", "power"]),
])
def test_power_above_a_share_of_the_models_tdp_for_several_samples_in_a_row_cordons_the_gpu(
        sample, tdp_w, samples_over_before, expect_over, expect):
    thresholds = health_services.Thresholds(90.0, 0, frozenset(), power_share=1.1, power_samples=5)
    assert health_services.power_over_limit(sample, thresholds, tdp_w=tdp_w) is expect_over
    reasons = health_services.sample_violations(sample, thresholds, previous_dbe=None, tdp_w=tdp_w,
                                                samples_over_power=samples_over_before)
    assert len(reasons) == len(expect)
    assert all(keyword in reason for keyword, reason in zip(expect, reasons))


def test_cordon_and_uncordon_are_idempotent_and_logged():
    node = online_node()
    gpu = node.gpus.get(index=0)
    assert health_services.gpu_cordon(gpu_id=gpu.pk, reason="fan failure", by="op")
    assert not health_services.gpu_cordon(gpu_id=gpu.pk, reason="again", by="op")
    gpu.refresh_from_db()
    assert gpu.health == Gpu.Health.CORDONED and "fan failure" in gpu.health_reason
    assert health_services.gpu_uncordon(gpu_id=gpu.pk, by="op", source=Gpu.CordonedBy.OPERATOR)
    assert not health_services.gpu_uncordon(gpu_id=gpu.pk, by="op", source=Gpu.CordonedBy.OPERATOR)
    assert list(HealthEvent.objects.filter(gpu=gpu).order_by("created_at").values_list("kind", flat=True)) == [
        "cordon", "uncordon"]


def _ready_slice(node, profile="2g.20gb", start=2, instance_uuid="MIG-abc"):
    gpu = node.gpus.get(index=0)
    sl = slice_services.slice_create(gpu_id=gpu.pk, profile=profile, start=start)
    command_services.command_complete(node_id=node.pk, frame=_result(AgentCommand.objects.get(slice=sl),
                                                                     instance_uuid=instance_uuid))
    sl.refresh_from_db()
    assert sl.state == Slice.State.READY
    return sl


def test_a_destroy_that_times_out_on_a_live_node_is_sent_again_until_the_agent_confirms():
    node = online_node()
    sl = _ready_slice(node)
    slice_services.slice_destroy(slice_id=sl.pk)
    assert command_services.commands_expire(now=timezone.now() + timedelta(hours=1)) == 1
    retry = AgentCommand.objects.get(slice=sl, op="destroy_instance", state=AgentCommand.State.PENDING)
    assert retry.args == {"gpu_uuid": sl.gpu.uuid, "instance_uuid": "MIG-abc"}
    command_services.command_complete(node_id=node.pk, frame=_result(retry, ok=True))
    sl.refresh_from_db()
    assert sl.state == Slice.State.DESTROYED


def test_a_slice_left_destroying_while_its_node_was_offline_is_settled_when_the_agent_says_hello_again():
    node, token = node_with_token()
    backend = sim_backend("a100-80gb:1", hostname="d")
    node_services.node_hello(node_id=node.pk, frame=hello_from(backend))
    gpu = node.gpus.get()
    made = [backend.create_instance(gpu.uuid, "3g.40gb", s) for s in (0, 4)]
    gone, still_there = (_ready_slice(node, "3g.40gb", s, m["instance_uuid"]) for s, m in zip((0, 4), made))
    Node.objects.filter(pk=node.pk).update(status=Node.Status.OFFLINE)
    for sl in (gone, still_there):
        slice_services.slice_destroy(slice_id=sl.pk)
    command_services.commands_expire(now=timezone.now() + timedelta(hours=1))
    assert not AgentCommand.objects.filter(state__in=AgentCommand.OPEN_STATES).exists()  # nothing to send to
    backend.destroy_instance(gpu.uuid, made[0]["instance_uuid"])  # the host removed one meanwhile
    node_services.node_hello(node_id=node.pk, frame=hello_from(backend))
    gone.refresh_from_db()
    still_there.refresh_from_db()
    assert gone.state == Slice.State.DESTROYED  # its memory slices are free again
    assert still_there.state == Slice.State.DESTROYING
    again = AgentCommand.objects.get(slice=still_there, state=AgentCommand.State.PENDING)
    assert again.op == "destroy_instance" and again.args["instance_uuid"] == made[1]["instance_uuid"]
    # A second hello does not pile up another destroy while one is open.
    node_services.node_hello(node_id=node.pk, frame=hello_from(backend))
    assert AgentCommand.objects.filter(slice=still_there, state=AgentCommand.State.PENDING).count() == 1


def test_a_create_result_arriving_after_the_timeout_destroys_the_orphan_instance_once():
    node = online_node()
    gpu = node.gpus.get(index=0)
    sl = slice_services.slice_create(gpu_id=gpu.pk, profile="1g.10gb", start=3)
    cmd = AgentCommand.objects.get(slice=sl)
    command_services.commands_expire(now=timezone.now() + timedelta(hours=1))
    sl.refresh_from_db()
    assert sl.state == Slice.State.FAILED
    late = _result(cmd, instance_uuid="MIG-late")
    command_services.command_complete(node_id=node.pk, frame=late)
    command_services.command_complete(node_id=node.pk, frame=late)  # a repeat changes nothing more
    destroys = AgentCommand.objects.filter(node=node, op="destroy_instance")
    assert [d.args["instance_uuid"] for d in destroys] == ["MIG-late"]


def test_a_drained_node_that_goes_offline_comes_back_draining_not_online(settings):
    settings.FLEET = {**settings.FLEET, "HEARTBEAT_TIMEOUT_SECONDS": 10}
    node, token = node_with_token()
    backend = sim_backend("l4:1", hostname="dr")
    node_services.node_hello(node_id=node.pk, frame=hello_from(backend))
    node_services.node_drain(node=node)
    now = timezone.now()
    Node.objects.filter(pk=node.pk).update(last_heartbeat=now - timedelta(seconds=11))
    assert node_services.nodes_mark_offline(now=now) == [node.pk]
    assert Node.objects.get(pk=node.pk).status == Node.Status.OFFLINE
    node_services.nodes_heartbeat(node_ids=[node.pk], at=now)  # its socket was still up: heard again
    assert Node.objects.get(pk=node.pk).status == Node.Status.DRAINING
    Node.objects.filter(pk=node.pk).update(status=Node.Status.OFFLINE)
    node_services.node_hello(node_id=node.pk, frame=hello_from(backend))  # the agent reconnects
    assert Node.objects.get(pk=node.pk).status == Node.Status.DRAINING
    # Undrained while offline: it comes back taking work.
    Node.objects.filter(pk=node.pk).update(status=Node.Status.OFFLINE)
    node_services.node_undrain(node=Node.objects.get(pk=node.pk))
    node_services.node_hello(node_id=node.pk, frame=hello_from(backend))
    assert Node.objects.get(pk=node.pk).status == Node.Status.ONLINE


@pytest.mark.parametrize("drained, expect", [(False, Node.Status.ONLINE), (True, Node.Status.DRAINING)])
def test_a_node_back_online_through_a_heartbeat_is_announced_and_logged_like_going_offline(
        settings, monkeypatch, django_capture_on_commit_callbacks, drained, expect):
    settings.FLEET = {**settings.FLEET, "HEARTBEAT_TIMEOUT_SECONDS": 10}
    back, steady = online_node(hostname="back"), online_node(hostname="steady")
    if drained:
        node_services.node_drain(node=back)
    now = timezone.now()
    Node.objects.filter(pk=back.pk).update(last_heartbeat=now - timedelta(seconds=11))
    assert node_services.nodes_mark_offline(now=now) == [back.pk]
    announced = []
    monkeypatch.setattr(node_services, "announce_node", lambda node_id, change: announced.append((node_id, change)))
    with django_capture_on_commit_callbacks(execute=True):
        node_services.nodes_heartbeat(node_ids=[back.pk, steady.pk], at=now)
    assert Node.objects.get(pk=back.pk).status == expect
    assert announced == [(back.pk, {"status": expect})]  # the node heard all along is not announced
    [event] = HealthEvent.objects.filter(node=back, kind="online")
    assert "back online" in event.message
    assert not HealthEvent.objects.filter(node=steady, kind="online").exists()
    # Heard again: already online, nothing more to say.
    with django_capture_on_commit_callbacks(execute=True):
        node_services.nodes_heartbeat(node_ids=[back.pk], at=now)
    assert len(announced) == 1 and HealthEvent.objects.filter(kind="online").count() == 1


def test_a_slice_the_market_port_says_is_held_is_refused_to_its_provider_and_released_to_the_market(monkeypatch):
    from scheduler import ports

    node = online_node()
    held, free = _ready_slice(node, instance_uuid="MIG-held"), _ready_slice(node, start=4, instance_uuid="MIG-free")

    class Market(type(ports.market())):
        def slice_holder(self, *, sl):
            return "held by a test lease" if sl.pk == held.pk else None

    monkeypatch.setattr(ports, "_market", Market())
    with pytest.raises(Conflict) as err:
        slice_services.slice_destroy(slice_id=held.pk, by_provider=True)
    assert err.value.status == 409 and "held by a test lease" in err.value.message
    assert Slice.objects.get(pk=held.pk).state == Slice.State.READY
    assert not AgentCommand.objects.filter(slice=held, op="destroy_instance").exists()
    assert slice_services.slice_destroy(slice_id=free.pk, by_provider=True).state == Slice.State.DESTROYING
    # The market ending its own lease is not a provider's request.
    assert slice_services.slice_destroy(slice_id=held.pk).state == Slice.State.DESTROYING


def _offline(node):
    Node.objects.filter(pk=node.pk).update(status=Node.Status.OFFLINE)


def test_a_gpu_reinstalled_in_another_node_of_the_same_provider_moves_there_with_its_history():
    provider = UserFactory()
    old, _ = node_with_token(provider=provider, name="old-server")
    new, _ = node_with_token(provider=provider, name="new-server")
    backend = sim_backend("l4:1", hostname="gpu-box", seed=11)
    node_services.node_hello(node_id=old.pk, frame=hello_from(backend))
    gpu = old.gpus.get()
    health_services.gpu_cordon(gpu_id=gpu.pk, reason="fan noise")
    _offline(old)  # the old server is dead; its GPU went into the new one
    node_services.node_hello(node_id=new.pk, frame=hello_from(sim_backend("l4:1", hostname="gpu-box", seed=11)))
    moved = Gpu.objects.get(uuid=gpu.uuid)
    assert moved.pk == gpu.pk and moved.node_id == new.pk and moved.present
    assert HealthEvent.objects.filter(gpu=moved, kind="cordon").exists()  # its history came along
    assert HealthEvent.objects.filter(node=new, gpu=moved, kind="gpu_moved").exists()
    assert HealthEvent.objects.filter(node=old, kind="gpu_moved").exists()
    assert not old.gpus.exists()


@pytest.mark.parametrize("same_provider, old_status", [
    (True, Node.Status.ONLINE),     # both servers up: one GPU cannot be in two of them
    (True, Node.Status.DRAINING),
    (False, Node.Status.OFFLINE),   # another provider's GPU is never taken over by a hello
])
def test_a_gpu_held_by_a_live_node_or_another_providers_node_is_still_refused(same_provider, old_status):
    old, _ = node_with_token()
    new, _ = node_with_token(provider=old.provider if same_provider else None)
    node_services.node_hello(node_id=old.pk, frame=hello_from(sim_backend("l4:1", hostname="gpu-box", seed=12)))
    Node.objects.filter(pk=old.pk).update(status=old_status)
    with pytest.raises(DomainError) as err:
        node_services.node_hello(node_id=new.pk, frame=hello_from(sim_backend("l4:1", hostname="gpu-box", seed=12)))
    assert err.value.status == 403
    assert Gpu.objects.get().node_id == old.pk and not new.gpus.exists()


def test_an_operator_releases_a_gpu_uuid_from_a_dead_node_so_another_node_can_claim_it(client):
    old, _ = node_with_token()
    node_services.node_hello(node_id=old.pk, frame=hello_from(sim_backend("l4:1", hostname="gpu-box", seed=13)))
    gpu = old.gpus.get()
    staff = UserFactory(username="fleet-op", is_staff=True, is_superuser=True)
    client.force_login(staff)
    r = client.post("/admin/scheduler/gpu/", {"action": "release", "_selected_action": [str(gpu.pk)]})
    assert r.status_code == 302
    assert Gpu.objects.get(pk=gpu.pk).uuid == gpu.uuid  # its node is online: refused
    _offline(old)
    client.post("/admin/scheduler/gpu/", {"action": "release", "_selected_action": [str(gpu.pk)]})
    released = Gpu.objects.get(pk=gpu.pk)
    assert released.uuid != gpu.uuid and not released.present and released.node_id == old.pk
    assert HealthEvent.objects.filter(gpu=released, kind="released").exists()
    other, _ = node_with_token()  # e.g. the server was sold to another provider
    node_services.node_hello(node_id=other.pk, frame=hello_from(sim_backend("l4:1", hostname="gpu-box", seed=13)))
    assert Gpu.objects.get(uuid=gpu.uuid).node_id == other.pk
