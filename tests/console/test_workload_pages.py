"""Console pages of workloads with the Django test client: ordering a template or an image with ports, a command,
environment and secrets; the lease page's container state, connection facts with copy buttons and kept output (and
its download); the jobs list; SSH keys on the account page; a provider's container settings on a node's page."""
from __future__ import annotations

from decimal import Decimal

import pytest

from marketplace.models import Lease, SshKey, Workload
from scheduler.models import AgentCommand, Node
from tests.factories import UserFactory
from tests.marketplace.marketsim import top_up

pytestmark = pytest.mark.django_db

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII6cfA2OIurHs+dTu9c14p5yrmF52O2y728gRqx60jW4 buyer@laptop"
ORDER = {"mode": "on_demand", "memory_gb": "10", "compute_slices": "1", "duration_hours": "1",
         "if_unavailable": "fail"}


@pytest.fixture
def buyer(client):
    user = UserFactory(username="ann")
    client.force_login(user)
    top_up(user, "50")
    return user


def test_ordering_a_template_runs_its_container_and_the_lease_page_shows_how_to_reach_it(client, fleet, buyer):
    node = fleet.node("h100-80gb:1")
    Node.objects.filter(pk=node.pk).update(public_address="203.0.113.7")
    form = client.get("/order/").content.decode()
    assert 'value="ubuntu-ssh"' in form and 'value="jupyter"' in form and 'value="image"' in form
    r = client.post("/order/", {**ORDER, "workload": "jupyter"})
    lease = Lease.objects.get(buyer=buyer)
    assert r.status_code == 302 and r["Location"] == f"/leases/{lease.pk}/"
    # Before its slice is carved the page already has the place its output will stream into.
    assert 'id="log-tail"' in client.get(r["Location"]).content.decode()
    fleet.play()
    fleet.output(lease, "[I 12:00:00 ServerApp] Jupyter Server is running\n")
    html = client.get(r["Location"]).content.decode()
    token = Workload.objects.get(order=lease.order).jupyter_token
    assert 'id="workload-state">running' in html
    assert f'http://203.0.113.7:20000/?token={token}' in html and 'data-copy="#url-8888"' in html
    assert "Jupyter Server is running" in html and f'href="/leases/{lease.pk}/logs/"' in html
    logs = client.get(f"/leases/{lease.pk}/logs/")
    assert logs["Content-Type"].startswith("text/plain") and b"Jupyter Server is running" in logs.content


def test_ordering_an_image_job_with_ports_command_and_secrets_sends_them_to_the_agent_only(client, fleet, buyer):
    fleet.node("h100-80gb:1")
    r = client.post("/order/", {**ORDER, "workload": "image", "image": "docker.io/me/train:3", "kind": "job",
                                "command": "python train.py --name 'a b'", "ports": "22/ssh, 6006/http",
                                "env": "EPOCHS=3\n# a comment\n", "secret_env": "HF_TOKEN=hf_s3cr3t",
                                "disk_gb": "40"})
    assert r.status_code == 302
    fleet.play()
    lease = Lease.objects.get(buyer=buyer)
    spec = AgentCommand.objects.get(op="start_workload").args["spec"]
    assert spec["image"] == "docker.io/me/train:3" and spec["args"] == ["python", "train.py", "--name", "a b"]
    assert spec["env"] == {"EPOCHS": "3", "HF_TOKEN": "hf_s3cr3t"} and spec["kind"] == "job"
    assert [p["container_port"] for p in spec["ports"]] == [22, 6006] and spec["limits"]["disk_gb"] == 40
    html = client.get(f"/leases/{lease.pk}/").content.decode()
    assert "hf_s3cr3t" not in html and 'data-copy="#ssh-command"' in html
    fleet.report(lease, "exited", exit_code=0)
    fleet.play()
    jobs = client.get("/jobs/").content.decode()
    assert "docker.io/me/train:3" in jobs and '<span class="ok">0</span>' in jobs


def test_a_bad_workload_is_shown_beside_its_field_keeps_what_was_typed_but_never_the_secrets(client, fleet, buyer):
    fleet.node("h100-80gb:1")
    r = client.post("/order/", {**ORDER, "workload": "image", "image": "", "ports": "22/sctp",
                                "env": "NOEQUALS", "secret_env": "HF_TOKEN=hf_s3cr3t"})
    html = r.content.decode()
    assert r.status_code == 400
    assert 'id="id_image_error"' in html and 'id="id_ports_error"' in html and 'id="id_env_error"' in html
    assert "22/sctp" in html and "hf_s3cr3t" not in html
    r = client.post("/order/", {**ORDER, "workload": "image", "image": "docker.io/x/y:1",
                                "env": "CUDA_VISIBLE_DEVICES=0"})
    assert r.status_code == 400 and 'id="id_env_error"' in r.content.decode()
    assert Lease.objects.count() == 0


def test_ssh_keys_are_added_and_removed_on_the_account_page(client, buyer):
    r = client.post("/account/ssh-keys/", {"ssh-name": "laptop", "ssh-public_key": KEY})
    assert r.status_code == 302
    html = client.get("/account/").content.decode()
    key = SshKey.objects.get(user=buyer)
    assert key.fingerprint in html and 'id="ssh-key-list"' in html
    bad = client.post("/account/ssh-keys/", {"ssh-name": "x", "ssh-public_key": "ssh-rsa nope"})
    assert bad.status_code == 400 and 'id="id_ssh-public_key_error"' in bad.content.decode()
    other = UserFactory()
    client.force_login(other)
    client.post(f"/account/ssh-keys/{key.pk}/delete/")
    assert SshKey.objects.filter(pk=key.pk).exists()  # not theirs
    client.force_login(buyer)
    client.post(f"/account/ssh-keys/{key.pk}/delete/")
    assert not SshKey.objects.exists()


def test_a_provider_sets_its_nodes_container_terms_on_the_node_page_and_through_the_api(client, fleet):
    node = fleet.node("h100-80gb:1")
    client.force_login(node.provider)
    html = client.get(f"/nodes/{node.pk}/").content.decode()
    assert "runtime: <strong>simulated</strong>" in html
    r = client.post(f"/nodes/{node.pk}/settings/", {
        "public_address": "gpu7.example.net", "port_range_start": "42000", "port_range_end": "42100",
        "cpus_per_gpu": "16", "ram_gb_per_gpu": "120", "image_allowlist": "docker.io/library/\nghcr.io/acme/\n"})
    assert r.status_code == 302
    node.refresh_from_db()
    assert (node.public_address, node.port_range_start, node.port_range_end) == ("gpu7.example.net", 42000, 42100)
    assert node.cpus_per_gpu == Decimal("16") and node.image_allowlist == ["docker.io/library/", "ghcr.io/acme/"]
    bad = client.post(f"/nodes/{node.pk}/settings/", {
        "public_address": "not an address", "port_range_start": "42000", "port_range_end": "41000",
        "cpus_per_gpu": "16", "ram_gb_per_gpu": "120"})
    assert bad.status_code == 400 and "is not a host name or an IP address" in bad.content.decode()
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(node.provider)
    r = api.patch(f"/api/v1/nodes/{node.pk}/", {"port_range_start": 50000, "port_range_end": 50999,
                                                 "image_allowlist": []}, format="json")
    assert r.status_code == 200 and r.json()["port_range_start"] == 50000 and r.json()["image_allowlist"] == []
    assert r.json()["runtime"] == "simulated"
    bad = api.patch(f"/api/v1/nodes/{node.pk}/", {"port_range_start": 60000, "port_range_end": 50000},
                    format="json")
    assert bad.status_code == 400 and "port_range_start" in bad.json()["error"]["fields"]
    stranger = APIClient()
    stranger.force_authenticate(UserFactory())
    assert stranger.patch(f"/api/v1/nodes/{node.pk}/", {"public_address": "x.example"},
                          format="json").status_code == 404
