"""Who cordoned a GPU is kept (health check, its provider, an operator) and an operator's cordon is lifted only by an
operator: not by the provider on the console nor on the API."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from scheduler.errors import PermissionDenied
from scheduler.models import Gpu
from scheduler.services import health as health_services
from tests.agentframes import hello_from, sim_backend
from tests.factories import ProviderFactory, UserFactory, node_with_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    from scheduler.services import nodes as node_services

    provider, operator = ProviderFactory(username="prov"), UserFactory(username="op", is_staff=True)
    node, _ = node_with_token(provider=provider, name="rack1")
    node_services.node_hello(node_id=node.pk, frame=hello_from(sim_backend("a100-80gb:2")))
    return provider, operator, node, node.gpus.order_by("index").first()


def api_for(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_a_provider_cannot_lift_an_operators_cordon_on_the_api_or_the_console(client, fleet):
    provider, operator, node, gpu = fleet
    r = api_for(operator).post(f"/api/v1/gpus/{gpu.uuid}/cordon/", {"reason": "suspected fraud"}, format="json")
    assert r.status_code == 200 and r.json()["cordoned_by"] == "operator"

    r = api_for(provider).post(f"/api/v1/gpus/{gpu.uuid}/uncordon/", {}, format="json")
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "cordoned_by_operator"
    assert "only an operator can put it back in service" in r.json()["error"]["message"]
    gpu.refresh_from_db()
    assert gpu.health == "cordoned" and gpu.cordoned_by == "operator"

    client.force_login(provider)
    page = client.get(f"/nodes/{node.pk}/").content.decode()
    assert f'id="gpu{gpu.index}-operator-cordon"' in page and "cordoned by an operator" in page
    r = client.post(f"/nodes/{node.pk}/gpus/{gpu.pk}/health/", {"action": "uncordon"}, follow=True)
    assert "only an operator can put it back in service" in r.content.decode()
    gpu.refresh_from_db()
    assert gpu.health == "cordoned"

    r = api_for(operator).post(f"/api/v1/gpus/{gpu.uuid}/uncordon/", {}, format="json")
    assert r.status_code == 200 and r.json()["health"] == "healthy" and r.json()["cordoned_by"] == ""


@pytest.mark.parametrize("first", ["health", "provider"])
def test_a_provider_lifts_its_own_or_the_health_checks_cordon(fleet, first):
    provider, _, _, gpu = fleet
    health_services.gpu_cordon(gpu_id=gpu.pk, reason="hot", by="x", source=first)
    assert health_services.gpu_uncordon(gpu_id=gpu.pk, by="prov", source="provider")
    gpu.refresh_from_db()
    assert gpu.health == "healthy" and gpu.cordoned_by == ""


def test_an_operators_cordon_takes_over_a_provider_cordon_and_a_later_health_cordon_leaves_it(fleet):
    provider, operator, _, gpu = fleet
    assert health_services.gpu_cordon(gpu_id=gpu.pk, reason="fan", by="prov", source="provider")
    assert health_services.gpu_cordon(gpu_id=gpu.pk, reason="abuse", by="op", source="operator")
    assert not health_services.gpu_cordon(gpu_id=gpu.pk, reason="hot", source="health")
    gpu.refresh_from_db()
    assert gpu.cordoned_by == "operator" and "abuse" in gpu.health_reason
    with pytest.raises(PermissionDenied):
        health_services.gpu_uncordon(gpu_id=gpu.pk, by="prov", source="provider")
    assert gpu.health_events.filter(kind="cordon").count() == 2


def test_the_admins_actions_cordon_as_an_operator(client, fleet):
    _, _, _, gpu = fleet
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(admin)
    client.post("/admin/scheduler/gpu/", {"action": "cordon", "_selected_action": [gpu.pk]})
    gpu.refresh_from_db()
    assert gpu.health == "cordoned" and gpu.cordoned_by == Gpu.CordonedBy.OPERATOR


def test_cordons_from_before_are_told_apart_by_their_reason():
    from importlib import import_module

    from django.apps import apps

    step = import_module("scheduler.migrations.0008_gpu_cordoned_by").who_cordoned_so_far
    node, _ = node_with_token(name="old")
    reasons = {"temperature 95 °C ≥ 90 °C (health check)": "health", "cordoned by an operator (root)": "operator",
               "fan noise (dan)": "provider"}
    gpus = [Gpu.objects.create(node=node, uuid=f"GPU-old-{i}", index=i, name="A100", memory_mib=81920,
                               health="cordoned", health_reason=reason) for i, reason in enumerate(reasons)]
    step(apps, None)
    assert [Gpu.objects.get(pk=g.pk).cordoned_by for g in gpus] == list(reasons.values())


def test_a_provider_cannot_lift_an_operators_drain_but_lifts_its_own(client, fleet):
    provider, operator, node, _ = fleet
    r = api_for(operator).post(f"/api/v1/nodes/{node.pk}/drain/", {}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "draining" and r.json()["drained_by"] == "operator"
    # The provider draining it again does not take it over.
    assert api_for(provider).post(f"/api/v1/nodes/{node.pk}/drain/", {}, format="json").json()["drained_by"] == \
        "operator"
    r = api_for(provider).post(f"/api/v1/nodes/{node.pk}/undrain/", {}, format="json")
    assert r.status_code == 403 and r.json()["error"]["code"] == "drained_by_operator"
    client.force_login(provider)
    page = client.get(f"/nodes/{node.pk}/").content.decode()
    assert 'id="drained-by-operator"' in page and 'value="undrain"' not in page
    r = client.post(f"/nodes/{node.pk}/drain/", {"action": "undrain"}, follow=True)
    assert "only an operator can put it back in service" in r.content.decode()
    node.refresh_from_db()
    assert node.drain_requested and node.status == "draining"

    r = api_for(operator).post(f"/api/v1/nodes/{node.pk}/undrain/", {}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "online" and r.json()["drained_by"] == ""
    assert api_for(provider).post(f"/api/v1/nodes/{node.pk}/drain/", {}, format="json").json()["drained_by"] == \
        "provider"
    r = api_for(provider).post(f"/api/v1/nodes/{node.pk}/undrain/", {}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "online"
