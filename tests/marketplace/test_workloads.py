"""Workloads on the database with simulated agents and the simulated container runtime: what an order runs, the
start command the agent gets, the lease following its container (running, a job's exit, a failure at start), host
ports, connection facts, notices, an agent's restart, logs and secrets. The same flows against a real engine and a
real agent process are in tests/e2e/test_workloads_e2e.py."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import override_settings
from django.utils import timezone

from marketplace.lifecycle import leases
from marketplace.models import Lease, Order, PortBinding, SshKey, Template, Workload, WorkloadRun
from marketplace.money.check import ledger_check
from marketplace.products import orders, spot
from marketplace.products.orders import OrderSpec
from marketplace.products.workloads import WorkloadSpec, ssh_fingerprint, ssh_key_add, workload_resolve
from scheduler.errors import Conflict, DomainError
from scheduler.models import AgentCommand, Node, Slice
from tests.factories import UserFactory
from tests.marketplace.marketsim import top_up, wallet

pytestmark = pytest.mark.django_db

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII6cfA2OIurHs+dTu9c14p5yrmF52O2y728gRqx60jW4 buyer@laptop"


def place(buyer, workload: WorkloadSpec | None, **spec) -> Order:
    return orders.order_place(buyer=buyer, spec=OrderSpec(mode=spec.pop("mode", "on_demand"), workload=workload,
                                                          **spec))


def start_command(lease: Lease) -> AgentCommand:
    return AgentCommand.objects.filter(op="start_workload", args__lease=str(lease.pk)).latest("created_at")


# --- the spec: templates, images, bounds --------------------------------------------------------------------------

def test_a_template_gives_its_defaults_and_the_buyer_overrides_what_they_name():
    Template.objects.create(key="jup", name="My Jupyter", image="quay.io/jupyter/base-notebook:2026-11",
                            ports=[{"port": 8888, "kind": "http"}], env={"JUPYTER_ENABLE_LAB": "yes"}, jupyter=True)
    w = workload_resolve(WorkloadSpec(template="jup", env=[{"name": "HF_TOKEN", "value": "s3", "secret": True}]))
    assert w["image"] == "quay.io/jupyter/base-notebook:2026-11"
    assert w["ports"] == [{"port": 8888, "protocol": "tcp", "kind": "http"}]
    assert {e["name"]: e["secret"] for e in w["env"]} == {"JUPYTER_ENABLE_LAB": False, "HF_TOKEN": True}
    assert len(w["jupyter_token"]) >= 24 and w["kind"] == "interactive"
    own = workload_resolve(WorkloadSpec(template="jup", image="docker.io/me/nb:1", ports=["22/tcp", 8080]))
    assert own["image"] == "docker.io/me/nb:1"
    assert own["ports"] == [{"port": 22, "protocol": "tcp", "kind": "ssh"}, {"port": 8080, "protocol": "tcp",
                                                                            "kind": "tcp"}]


@pytest.mark.parametrize("spec, field", [
    (WorkloadSpec(), "workload.image"),
    (WorkloadSpec(image="ubuntu 24.04"), "workload.image"),
    (WorkloadSpec(template="nope"), "workload.template"),
    (WorkloadSpec(image="x", env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]), "workload.env"),
    (WorkloadSpec(image="x", env=[{"name": "1BAD", "value": "0"}]), "workload.env"),
    (WorkloadSpec(image="x", ports=[{"port": 22}, {"port": 22}]), "workload.ports"),
    (WorkloadSpec(image="x", ports=[{"port": 70000}]), "workload.ports"),
    (WorkloadSpec(image="x", disk_gb=0), "workload.disk_gb"),
    (WorkloadSpec(image="x", kind="batch"), "workload.kind"),
    (WorkloadSpec(image="x", notice="email"), "workload.notice"),
])
def test_a_bad_workload_is_refused_naming_its_field_and_writes_nothing(fleet, spec, field):
    fleet.node()
    buyer = UserFactory()
    top_up(buyer, "10")
    with pytest.raises(DomainError) as err:
        place(buyer, spec, memory_gb=10)
    assert err.value.field == field
    assert not Order.objects.exists() and not Slice.objects.exists()


def test_ssh_keys_are_checked_fingerprinted_and_kept_once_per_account():
    buyer = UserFactory()
    key = ssh_key_add(user=buyer, name="laptop", public_key=KEY)
    assert key.fingerprint == ssh_fingerprint(KEY) and key.fingerprint.startswith("SHA256:")
    with pytest.raises(Conflict):
        ssh_key_add(user=buyer, name="again", public_key=KEY)
    for bad in ("ssh-ed25519", "ssh-ed25519 not-base64!", "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIGJ3", "hello world"):
        with pytest.raises(DomainError) as err:
            ssh_key_add(user=buyer, name="bad", public_key=bad)
        assert err.value.field == "public_key"
    assert SshKey.objects.filter(user=buyer).count() == 1


# --- placement: where a workload may run --------------------------------------------------------------------------

def test_a_workload_only_lands_on_nodes_that_run_containers_and_allow_its_image(fleet):
    fleet.node(runtime="none")
    allowlisted = fleet.node(runtime="simulated")
    Node.objects.filter(pk=allowlisted.pk).update(image_allowlist=["ghcr.io/acme/"])
    buyer = UserFactory()
    top_up(buyer, "10")
    with pytest.raises(Conflict) as err:
        place(buyer, WorkloadSpec(image="docker.io/library/ubuntu:24.04"), memory_gb=10)
    assert err.value.message == ("No GPU slice with 10 GB is free right now: of 2 GPUs, 1 is without containers (its "
                                 "server runs none) and 1 is closed to your image by its provider.")
    assert err.value.details["reasons"] == {"node runs no containers": 1, "image not allowed by the provider": 1}
    order = place(buyer, WorkloadSpec(image="ghcr.io/acme/trainer:3"), memory_gb=10)
    assert order.leases.get().slice.gpu.node_id == allowlisted.pk
    # an order without a workload still lands anywhere
    assert place(buyer, None, memory_gb=10).state == Order.State.PLACED


# --- running ------------------------------------------------------------------------------------------------------

def test_the_container_gets_the_slice_only_with_its_share_of_cpu_and_ram_and_billing_starts_when_it_runs(fleet):
    node = fleet.node("a100-80gb:1", price="2.00")
    Node.objects.filter(pk=node.pk).update(cpus_per_gpu=14, ram_gb_per_gpu=112, public_address="203.0.113.7")
    buyer = UserFactory()
    top_up(buyer, "100")
    ssh_key_add(user=buyer, name="laptop", public_key=KEY)
    order = place(buyer, WorkloadSpec(image="docker.io/library/ubuntu:24.04", ports=["22/tcp",
                                      {"port": 8888, "kind": "http"}]), memory_gb=10)
    lease = order.leases.get()
    fleet.play()
    lease.refresh_from_db()
    run = WorkloadRun.objects.get(lease=lease)
    assert lease.state == Lease.State.RUNNING and run.state == WorkloadRun.State.RUNNING
    assert lease.started_at == run.started_at  # billing from the container's start, not the slice's
    spec = start_command(lease).args["spec"]
    # 1g.10gb on an A100-80GB is 1/7 of the GPU: 2 of 14 CPUs, 16 of 112 GB
    assert spec["device"] == {"gpu_uuid": lease.slice.gpu.uuid, "instance_uuid": lease.slice.instance_uuid}
    assert spec["limits"] == {"cpus": 2.0, "memory_mb": 16384, "disk_gb": 20}
    assert spec["ssh_keys"] == [KEY]
    ports = {b.container_port: b.host_port for b in PortBinding.objects.filter(run=run)}
    assert ports == {22: 20000, 8888: 20001}
    assert [(p["container_port"], p["host_port"]) for p in spec["ports"]] == [(22, 20000), (8888, 20001)]
    facts = leases.connection_facts(lease)
    assert facts["ssh"] == "ssh -p 20000 root@203.0.113.7"
    assert facts["urls"] == ["http://203.0.113.7:20001/"]


def test_two_leases_on_a_node_never_share_a_host_port_and_ending_gives_the_ports_back(fleet):
    node = fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    a = place(buyer, WorkloadSpec(image="img:1", ports=["22/tcp"]), memory_gb=10).leases.get()
    b = place(buyer, WorkloadSpec(image="img:1", ports=["22/tcp", "80/tcp"]), memory_gb=10).leases.get()
    fleet.play()
    hosts = list(PortBinding.objects.filter(node=node).values_list("host_port", flat=True))
    assert sorted(hosts) == [20000, 20001, 20002]
    for lease in (a, b):
        leases.lease_end(lease_id=lease.pk, buyer=buyer)
    fleet.play()
    assert not PortBinding.objects.exists()
    assert set(Lease.objects.values_list("state", flat=True)) == {Lease.State.ENDED}
    assert set(WorkloadRun.objects.values_list("state", flat=True)) == {WorkloadRun.State.REMOVED}
    assert set(Slice.objects.values_list("state", flat=True)) == {Slice.State.DESTROYED}
    assert fleet.runtimes[node.pk].found() == []


def test_a_node_whose_port_range_is_full_fails_the_lease_with_the_reason_and_refunds(fleet):
    node = fleet.node("a100-80gb:1")
    Node.objects.filter(pk=node.pk).update(port_range_start=41000, port_range_end=41000)
    buyer = UserFactory()
    top_up(buyer, "100")
    first = place(buyer, WorkloadSpec(image="img:1", ports=["22/tcp"]), memory_gb=10).leases.get()
    second = place(buyer, WorkloadSpec(image="img:1", ports=["22/tcp"]), memory_gb=10).leases.get()
    fleet.play()
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == Lease.State.RUNNING
    assert second.state == Lease.State.FAILED and second.end_reason == "workload failed"
    assert Order.objects.get(pk=second.order_id).explain.endswith("no free host port left in 41000-41000")
    assert second.slice.state == Slice.State.DESTROYED


def test_a_job_ends_its_lease_at_its_exit_and_is_billed_for_its_running_seconds_only(fleet):
    fleet.node("a100-80gb:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    order = place(buyer, WorkloadSpec(image="img:1", kind="job", command=["sh", "-c", "exit 3"]), memory_gb=10,
                  duration_seconds=3600)
    lease = order.leases.get()
    fleet.play()
    lease.refresh_from_db()
    assert start_command(lease).args["spec"]["max_seconds"] == 3600
    started = lease.started_at
    fleet.output(lease, "hi\n")
    # billing counts whole seconds from its start truncated to the second (metering.billing_start)
    fleet.report(lease, "exited", exit_code=3, at=int(started.timestamp()) + 125.25)
    fleet.play()
    lease.refresh_from_db()
    run = lease.run
    assert lease.state == Lease.State.ENDED and lease.end_reason == "job finished with code 3"
    assert run.exit_code == 3 and run.seconds in (124, 125) and "hi" in run.log_tail
    assert run.state == WorkloadRun.State.REMOVED
    # 1/7 of 1.8 x 2.00 per hour for the 125 whole seconds it ran (billing is per second), to the micro-dollar
    per_hour = Decimal("0.514286")
    assert lease.price_per_hour == per_hour
    expected = (per_hour * 125 / 3600).quantize(Decimal("0.000001"))
    assert lease.cost_charged == expected and wallet(buyer) == Decimal("100") - expected
    assert ledger_check() == []


def test_an_image_that_cannot_be_pulled_fails_the_lease_with_the_engines_reason_refunds_and_leaves_nothing(fleet):
    node = fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    order = place(buyer, WorkloadSpec(image="docker.io/me/app:missing", ports=["22/tcp"]), memory_gb=10,
                  if_unavailable="queue")
    lease = order.leases.get()
    fleet.play()
    lease.refresh_from_db()
    order.refresh_from_db()
    assert lease.state == Lease.State.FAILED and lease.end_reason == "workload failed"
    assert "could not be pulled: manifest unknown" in lease.run.error
    assert order.state == Order.State.FAILED and "could not be pulled" in order.explain  # not queued again
    assert lease.slice.state == Slice.State.DESTROYED and not PortBinding.objects.exists()
    assert wallet(buyer) == Decimal("100") and lease.cost_charged == 0
    assert fleet.runtimes[node.pk].found() == []


def test_a_container_that_dies_at_start_fails_the_lease(fleet):
    fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = place(buyer, WorkloadSpec(image="img:1"), memory_gb=10).leases.get()
    fleet.play(fail_creates=False)
    # The runtime said running; the next report is the container gone with an error before billing mattered.
    Lease.objects.filter(pk=lease.pk).update(state=Lease.State.PROVISIONING)
    fleet.report(lease, "failed", reason="exec /bin/train: no such file or directory")
    fleet.play()
    lease.refresh_from_db()
    assert lease.state == Lease.State.FAILED
    assert lease.run.error == "exec /bin/train: no such file or directory"


def test_an_agent_without_a_container_engine_refuses_the_start_and_the_lease_fails_with_its_words(fleet):
    node = fleet.node("a100-80gb:1")
    fleet.runtimes.pop(node.pk)  # it said it runs containers, and it cannot
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = place(buyer, WorkloadSpec(image="img:1"), memory_gb=10).leases.get()
    fleet.play()
    lease.refresh_from_db()
    assert lease.state == Lease.State.FAILED and "runs no container engine" in lease.run.error
    assert wallet(buyer) == Decimal("100")


def test_ending_a_lease_stops_its_container_first_then_destroys_its_slice(fleet):
    node = fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = place(buyer, WorkloadSpec(image="img:1"), memory_gb=10).leases.get()
    fleet.play()
    leases.lease_end(lease_id=lease.pk, buyer=buyer)
    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDING and lease.slice.state == Slice.State.READY  # the container first
    stop = AgentCommand.objects.get(op="stop_workload")
    assert stop.args["grace_seconds"] == 10
    fleet.play()
    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDED and lease.slice.state == Slice.State.DESTROYED
    ops = list(AgentCommand.objects.filter(node=node).order_by("created_at").values_list("op", flat=True))
    assert ops.index("stop_workload") < ops.index("destroy_instance")


# --- spot notices ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["sigterm", "file"])
def test_a_spot_notice_reaches_the_container_as_the_buyer_chose_and_the_deadline_kills_it(fleet, mode):
    fleet.node("a100-80gb:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    spot.spot_prices_recompute()
    lease = place(buyer, WorkloadSpec(image="img:1", notice=mode), mode="spot", memory_gb=10,
                  max_price_per_hour=Decimal("0.5")).leases.get()
    fleet.play()
    now = timezone.now()
    leases.lease_interrupt(lease_id=lease.pk, kind="outbid", now=now)
    notice = AgentCommand.objects.get(op="notice")
    assert notice.args["mode"] == mode and notice.args["lease"] == str(lease.pk)
    fleet.play()
    lease.refresh_from_db()
    assert ("SIGTERM" if mode == "sigterm" else "a notice file") in lease.run.log_tail
    leases.leases_tick(now=lease.ends_at + timedelta(seconds=1))
    assert AgentCommand.objects.get(op="stop_workload").args["grace_seconds"] == 0  # the notice was its grace
    fleet.play()
    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDED and lease.end_reason == "interrupted"


# --- an agent that restarts -----------------------------------------------------------------------------------------

def test_a_restarted_agent_has_running_containers_adopted_and_those_of_ended_leases_removed(fleet):
    node = fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    kept = place(buyer, WorkloadSpec(image="img:1"), memory_gb=10).leases.get()
    fleet.play()
    starts = AgentCommand.objects.filter(op="start_workload").count()
    # A container of a lease the server no longer knows as open (it ended while the agent was away).
    ghost = place(buyer, WorkloadSpec(image="img:1"), memory_gb=10).leases.get()
    fleet.play()
    Lease.objects.filter(pk=ghost.pk).update(state=Lease.State.ENDED)
    found = fleet.restart(node)
    assert {f["lease"] for f in found} == {str(kept.pk), str(ghost.pk)}
    fleet.play()
    kept.refresh_from_db()
    assert kept.state == Lease.State.RUNNING
    assert AgentCommand.objects.filter(op="start_workload").count() == starts + 1  # the ghost's, none again
    assert [f["lease"] for f in fleet.runtimes[node.pk].found()] == [str(kept.pk)]


def test_a_running_lease_whose_container_is_gone_after_a_restart_ends(fleet):
    node = fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = place(buyer, WorkloadSpec(image="img:1"), memory_gb=10).leases.get()
    fleet.play()
    fleet.runtimes[node.pk].stop(str(lease.pk), 0)  # e.g. someone removed it by hand on the node
    fleet.frames.clear()
    fleet.restart(node)
    fleet.play()
    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDED and lease.end_reason == "container lost on the node"


# --- output and secrets ---------------------------------------------------------------------------------------------

@override_settings(MARKET={**__import__("django.conf").conf.settings.MARKET, "WORKLOAD_LOG_TAIL_BYTES": 1024})
def test_output_keeps_a_bounded_tail_and_counts_everything(fleet):
    fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = place(buyer, WorkloadSpec(image="img:1"), memory_gb=10).leases.get()
    fleet.play()
    before = WorkloadRun.objects.get(lease=lease).log_bytes  # the runtime's own first line
    for i in range(100):
        fleet.output(lease, f"line {i:03d} " + "x" * 40 + "\n")
    run = WorkloadRun.objects.get(lease=lease)
    assert len(run.log_tail) == 1024 and run.log_tail.endswith("line 099 " + "x" * 40 + "\n")
    assert run.log_bytes == before + 100 * 50


def test_secret_values_reach_the_agent_and_are_never_shown_back(fleet, client):
    fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    order = place(buyer, WorkloadSpec(image="img:1", env=[{"name": "HF_TOKEN", "value": "hf_s3cr3t",
                                                           "secret": True},
                                                          {"name": "MODE", "value": "train"}]), memory_gb=10)
    lease = order.leases.get()
    fleet.play()
    cmd = start_command(lease)
    assert cmd.args["spec"]["env"]["HF_TOKEN"] == "hf_s3cr3t" and cmd.args["spec"]["secret_names"] == ["HF_TOKEN"]
    assert "hf_s3cr3t" not in str(cmd.args_shown())
    assert Workload.objects.get(order=order).public_env() == [
        {"name": "HF_TOKEN", "value": None, "secret": True}, {"name": "MODE", "value": "train", "secret": False}]
    client.force_login(buyer)
    for url in (f"/api/v1/orders/{order.pk}/", f"/api/v1/leases/{lease.pk}/", f"/leases/{lease.pk}/"):
        body = client.get(url).content.decode()
        assert "hf_s3cr3t" not in body, url


# --- the API ---------------------------------------------------------------------------------------------------------

def api_for(user):
    from rest_framework.test import APIClient

    c = APIClient()
    c.force_authenticate(user)
    return c


def test_the_api_places_an_order_with_a_workload_shows_its_state_connection_and_logs(fleet):
    node = fleet.node("a100-80gb:1")
    Node.objects.filter(pk=node.pk).update(public_address="203.0.113.7")
    buyer = UserFactory()
    top_up(buyer, "100")
    api = api_for(buyer)
    assert [t["key"] for t in api.get("/api/v1/templates/").json()] == ["ubuntu-ssh", "pytorch", "jupyter", "vllm"]
    r = api.post("/api/v1/ssh-keys/", {"name": "laptop", "public_key": KEY}, format="json")
    assert r.status_code == 201 and r.json()["fingerprint"].startswith("SHA256:")
    bad = api.post("/api/v1/ssh-keys/", {"name": "x", "public_key": "ssh-ed25519 nope"}, format="json")
    assert bad.status_code == 400 and "public_key" in bad.json()["error"]["fields"]
    r = api.post("/api/v1/orders/", {"mode": "on_demand", "memory_gb": 10, "workload": {
        "template": "ubuntu-ssh", "env": [{"name": "WANDB_KEY", "value": "w4ndb", "secret": True}]}}, format="json")
    assert r.status_code == 201, r.json()
    assert r.json()["workload"]["image"] == "docker.io/library/ubuntu:24.04"
    assert r.json()["workload"]["env"] == [{"name": "WANDB_KEY", "value": None, "secret": True}]
    lease_id = r.json()["leases"][0]
    fleet.play()
    lease = api.get(f"/api/v1/leases/{lease_id}/").json()
    assert lease["workload"]["state"] == "running"
    assert lease["connection"]["ssh"] == "ssh -p 20000 root@203.0.113.7"
    fleet.output(Lease.objects.get(pk=lease_id), "epoch 1 done\n")
    logs = api.get(f"/api/v1/leases/{lease_id}/logs/")
    assert logs.status_code == 200 and logs["Content-Type"].startswith("text/plain")
    assert "epoch 1 done" in logs.content.decode() and "attachment" in logs["Content-Disposition"]
    bad = api.post("/api/v1/orders/", {"mode": "on_demand", "workload": {"image": "ubuntu 24"}}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["fields"] == {"workload.image": [
        bad.json()["error"]["message"]]}
    key_id = api.get("/api/v1/ssh-keys/").json()["results"][0]["id"]
    assert api.delete(f"/api/v1/ssh-keys/{key_id}/").status_code == 204
    other = api_for(UserFactory())
    assert other.get(f"/api/v1/leases/{lease_id}/logs/").status_code == 404


def test_an_instance_gone_from_the_node_ends_its_running_lease_billed_up_to_then_and_stops_its_container(fleet):
    node = fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = place(buyer, WorkloadSpec(image="img:1"), memory_gb=10).leases.get()
    fleet.play()
    lease.refresh_from_db()
    # The agent comes back without the instance (a GPU reset, a reboot): its lease lost it.
    fleet.backends[node.pk].destroy_instance(lease.slice.gpu.uuid, lease.slice.instance_uuid)
    fleet.restart(node)
    fleet.play()
    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDED and lease.end_reason == "instance lost on the node"
    assert lease.slice.state == Slice.State.FAILED and lease.run.state == WorkloadRun.State.REMOVED
    assert fleet.runtimes[node.pk].found() == []
    assert ledger_check() == []


def test_an_ending_lease_whose_slice_is_gone_already_ends_instead_of_waiting_forever(fleet):
    fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = place(buyer, None, memory_gb=10).leases.get()
    fleet.play()
    lease.refresh_from_db()
    Slice.objects.filter(pk=lease.slice_id).update(state=Slice.State.FAILED)  # lost while nobody looked
    leases.lease_end(lease_id=lease.pk, buyer=buyer)
    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDED
