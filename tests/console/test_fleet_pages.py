"""Console pages of the fleet: login, nodes list, node page with the MIG layout, registration form."""
from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.models import Node
from scheduler.services import nodes as node_services
from scheduler.services import slices as slice_services
from tests.agentframes import hello_from, sim_backend
from tests.factories import ProviderFactory, UserFactory, node_with_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def provider(client):
    user = ProviderFactory(username="prov")
    client.force_login(user)
    return user


def test_pages_need_a_login(client):
    r = client.get("/nodes/")
    assert r.status_code == 302 and r["Location"].startswith("/login/")


def test_logging_in_with_a_wrong_password_shows_an_error_and_keeps_the_username(client):
    UserFactory(username="alice")
    r = client.post("/login/", {"username": "alice", "password": "wrong"})
    assert r.status_code == 200
    assert b"Wrong username, e-mail or password." in r.content
    assert b'value="alice"' in r.content


def test_the_nodes_page_lists_only_my_nodes_in_a_fixed_number_of_queries(client, provider):
    def page():
        with CaptureQueriesContext(connection) as ctx:
            r = client.get("/nodes/")
        assert r.status_code == 200
        return r, len(ctx.captured_queries)

    node_with_token(name="someone-elses")
    for i in range(2):
        node_with_token(provider=provider, name=f"mine-{i}")
    r, few = page()
    assert b"mine-0" in r.content and b"someone-elses" not in r.content
    for i in range(2, 30):
        node_with_token(provider=provider, name=f"mine-{i}")
    r, many = page()
    assert b"mine-29" in r.content and many == few


def test_the_node_page_draws_each_gpus_mig_layout_from_its_slices(client, provider):
    node, _ = node_with_token(provider=provider, name="rack")
    node_services.node_hello(node_id=node.pk, frame=hello_from(sim_backend("a100-80gb:1,l4:1", hostname="r")))
    gpu = node.gpus.get(index=0)
    slice_services.slice_create(gpu_id=gpu.pk, profile="3g.40gb", start=4)
    slice_services.slice_create(gpu_id=gpu.pk, profile="2g.20gb", start=0)
    r = client.get(f"/nodes/{node.pk}/")
    assert r.status_code == 200
    html = r.content.decode()
    layout = re.search(r'aria-label="MIG layout of gpu0: ([^"]+)"', html).group(1)
    # 8 memory slices: 2g at 0-1, free 2, free 3, 3g at 4-7
    assert layout == "2g.20gb, free, free, 3g.40gb"
    assert "grid-column: span 4" in html and 'data-metric="util"' in html
    assert "whole GPU" in html  # the L4 has no MIG
    frag = client.get(f"/nodes/{node.pk}/gpus/")
    assert frag.status_code == 200 and "3g.40gb" in frag.content.decode() and "<html" not in frag.content.decode()


def test_another_providers_node_page_is_not_found(client, provider):
    node, _ = node_with_token(name="not-mine")
    assert client.get(f"/nodes/{node.pk}/").status_code == 404
    assert client.get(f"/nodes/{node.pk}/gpus/").status_code == 404


def test_registering_a_node_shows_the_token_once_with_the_agent_command(client, provider):
    r = client.post("/nodes/register/", {"name": "rack9", "region": "us-east", "price_per_gpu_hour": "1.75"})
    assert r.status_code == 200
    token = re.search(r'id="node-token">([^<]+)<', r.content.decode()).group(1)
    node = Node.objects.get(name="rack9")
    assert node_services.node_for_token(token=token) == node
    assert f"NODEAGENT_TOKEN={token} python -m nodeagent --server ws://" in r.content.decode()
    assert "--token" not in r.content.decode()
    assert token not in client.get(f"/nodes/{node.pk}/").content.decode()


def test_a_bad_registration_shows_the_error_beside_the_field_and_keeps_what_was_typed(client, provider):
    node_with_token(provider=provider, name="taken")
    r = client.post("/nodes/register/", {"name": "taken", "region": "eu-north", "price_per_gpu_hour": "2"})
    html = r.content.decode()
    assert r.status_code == 400 and "already have a node named" in html
    assert 'value="eu-north"' in html and 'aria-invalid="true"' in html
    r = client.post("/nodes/register/", {"name": "fresh", "region": "eu", "price_per_gpu_hour": "-5"})
    assert r.status_code == 400 and "greater than or equal to 0" in r.content.decode()
    assert Node.objects.filter(provider=provider).count() == 1


def test_the_nodes_page_title_is_plain_text(client, provider):
    html = client.get("/nodes/").content.decode()
    title = re.search(r"<title>(.*?)</title>", html, re.S).group(1)
    assert title.strip() == "My nodes · GPU Market"
    assert html.count('id="earn-h"') == 1
