"""The fleet's REST API: registration with the token shown once, permissions, errors, query counts."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from marketplace.products.apikeys import api_key_create, api_key_revoke
from scheduler.models import Node, Slice
from scheduler.services import nodes as node_services
from tests.agentframes import hello_from, sim_backend
from tests.factories import ProviderFactory, UserFactory, client_for, node_with_token

pytestmark = pytest.mark.django_db



def test_registering_a_node_returns_its_token_once_with_the_agent_command():
    user = ProviderFactory()
    c = client_for(user)
    r = c.post("/api/v1/nodes/", {"name": "rack1-h100", "region": "us-east", "price_per_gpu_hour": "2.5"},
               format="json")
    assert r.status_code == 201, r.content
    token = r.json()["token"]
    assert token.startswith("gpm_node_")
    # The token rides in the environment as the docs say, never on the command line other users can read.
    assert r.json()["agent_command"] == (f"NODEAGENT_TOKEN={token} python -m nodeagent "
                                         f"--server ws://testserver/ws/agent/")
    node = Node.objects.get(pk=r.json()["id"])
    assert node.provider == user and node.token_hash != token
    detail = c.get(f"/api/v1/nodes/{node.pk}/").json()
    assert "token" not in detail and detail["token_prefix"] == token[:12]


@pytest.mark.parametrize("body, field", [
    ({}, "name"), ({"name": ""}, "name"), ({"name": "x", "price_per_gpu_hour": "-3"}, "price_per_gpu_hour"),
    ({"name": "x", "price_per_gpu_hour": "lots"}, "price_per_gpu_hour"),
])
def test_bad_registrations_get_one_error_shape_and_write_nothing(body, field):
    r = client_for(UserFactory()).post("/api/v1/nodes/", body, format="json")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "invalid" and field in err["fields"] and err["message"]
    assert Node.objects.count() == 0


def test_malformed_json_and_wrong_content_type_are_refused_with_a_clear_error():
    c = client_for(UserFactory())
    r = c.generic("POST", "/api/v1/nodes/", "{nope", content_type="application/json")
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = c.generic("POST", "/api/v1/nodes/", "name=x", content_type="text/plain")
    assert r.status_code == 415 and r.json()["error"]["message"]
    assert Node.objects.count() == 0


def test_a_provider_sees_and_touches_only_its_own_nodes_gpus_and_slices():
    mine, _ = node_with_token(name="mine")
    theirs, _ = node_with_token(name="theirs")
    for node, host in ((mine, "m"), (theirs, "t")):
        node_services.node_hello(node_id=node.pk, frame=hello_from(sim_backend("a100-80gb:1", hostname=host)))
    c = client_for(mine.provider)
    assert [n["name"] for n in c.get("/api/v1/nodes/").json()["results"]] == ["mine"]
    assert c.get(f"/api/v1/nodes/{theirs.pk}/").status_code == 404
    their_gpu = theirs.gpus.get().uuid
    assert c.get(f"/api/v1/gpus/{their_gpu}/").status_code == 404
    assert c.post(f"/api/v1/gpus/{their_gpu}/cordon/").status_code == 404
    r = c.post("/api/v1/slices/", {"gpu": their_gpu, "profile": "1g.10gb", "start": 0}, format="json")
    assert r.status_code == 404 and not Slice.objects.exists()
    assert c.post(f"/api/v1/nodes/{theirs.pk}/drain/").status_code == 404
    assert Node.objects.get(pk=theirs.pk).status == Node.Status.ONLINE


def test_carving_a_slice_through_the_api_and_refusing_an_illegal_one():
    node, _ = node_with_token()
    node_services.node_hello(node_id=node.pk, frame=hello_from(sim_backend("h100-80gb:1", hostname="s")))
    gpu = node.gpus.get().uuid
    c = client_for(node.provider)
    r = c.post("/api/v1/slices/", {"gpu": gpu, "profile": "3g.40gb", "start": 4}, format="json")
    assert r.status_code == 201 and r.json()["state"] == "creating"
    r = c.post("/api/v1/slices/", {"gpu": gpu, "profile": "3g.40gb", "start": 2}, format="json")
    assert r.status_code == 409 and "cannot start at memory slice 2" in r.json()["error"]["message"]
    r = c.post("/api/v1/slices/", {"gpu": gpu, "profile": "9g.99gb"}, format="json")
    assert r.status_code == 400 and r.json()["error"]["fields"]["profile"]
    assert Slice.objects.count() == 1


def test_api_keys_authenticate_scripts_until_revoked():
    user = UserFactory()
    node_with_token(provider=user, name="k")
    key, secret = api_key_create(user=user, name="ci")
    c = APIClient()
    assert c.get("/api/v1/nodes/").status_code in (401, 403)
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert c.get("/api/v1/nodes/").json()["count"] == 1
    api_key_revoke(user=user, key_id=key.pk)
    r = c.get("/api/v1/nodes/")
    assert r.status_code == 401 and r.json()["error"]["message"] == "unknown or revoked API key"


def test_listing_nodes_and_gpus_takes_a_fixed_number_of_queries_whatever_the_fleet_size():
    user = UserFactory()

    def make(n):
        for i in range(n):
            node, _ = node_with_token(provider=user, name=f"n{Node.objects.count()}")
            node_services.node_hello(node_id=node.pk, frame=hello_from(
                sim_backend("a100-80gb:2", hostname=f"q{node.name}")))

    def queries(url):
        c = client_for(user)
        with CaptureQueriesContext(connection) as ctx:
            assert c.get(url).status_code == 200
        return len(ctx.captured_queries)

    make(2)
    small = {u: queries(u) for u in ("/api/v1/nodes/", "/api/v1/gpus/")}
    make(10)
    assert {u: queries(u) for u in small} == small


def test_the_openapi_schema_and_its_docs_page_are_served():
    c = client_for(UserFactory())
    schema = c.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200 and "/api/v1/nodes/" in schema.content.decode()
    docs = c.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()


def test_a_provider_cannot_destroy_a_slice_under_a_buyers_lease_but_may_destroy_one_carved_by_hand():
    from marketplace.models import Lease
    from marketplace.products import orders
    from marketplace.products.orders import OrderSpec
    from tests.marketplace.marketsim import Fleet, top_up

    fleet = Fleet()
    node = fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=10))
    fleet.play()
    lease = Lease.objects.get(order=order)
    assert lease.state == Lease.State.RUNNING
    c = client_for(node.provider)
    r = c.delete(f"/api/v1/slices/{lease.slice_id}/")
    assert r.status_code == 409, r.content
    message = r.json()["error"]["message"]
    assert "lease" in message and "drain" in message and "cordon" in message
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING and lease.slice.state == Slice.State.READY
    # A slice carved by hand (no lease) is the provider's to destroy.
    r = c.post("/api/v1/slices/", {"gpu": lease.slice.gpu.uuid, "profile": "1g.10gb"}, format="json")
    assert r.status_code == 201, r.content
    fleet.play()
    r = c.delete(f"/api/v1/slices/{r.json()['id']}/")
    assert r.status_code == 202 and r.json()["state"] == "destroying"


def test_an_unknown_api_path_gets_the_json_error_shape(client):
    r = client.get("/api/v1/leases//")
    assert r.status_code == 404 and r["Content-Type"].startswith("application/json")
    assert r.json()["error"]["code"] == "not_found" and "/api/docs/" in r.json()["error"]["message"]


def test_fleet_writes_refuse_a_form_encoded_body_and_write_nothing():
    r = client_for(UserFactory()).post("/api/v1/nodes/", "name=rack1", content_type="application/x-www-form-urlencoded")
    assert r.status_code == 415 and r.json()["error"]["message"]
    assert Node.objects.count() == 0
