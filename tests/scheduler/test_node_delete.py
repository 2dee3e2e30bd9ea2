"""Renaming and deleting nodes (one service each, used by the API and the console): a node with a buyer's open lease
or a live reservation is a clear 409; otherwise its token stops working, its agent is told and disconnected, it
leaves every list and placement, and the row stays for the money that names it."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.models import Lease, Order, Reservation
from marketplace.money.earnings import earnings
from marketplace.products import orders
from marketplace.products.orders import OrderSpec
from nodeagent import protocol
from scheduler.errors import Conflict, DomainError
from scheduler.models import Gpu, HealthEvent, Node
from scheduler.services import nodes as node_services
from tests.agentframes import hello_from, sim_backend
from tests.factories import UserFactory, node_with_token
from tests.marketplace.marketsim import Fleet, top_up


def provider_client(user) -> APIClient:
    c = APIClient()
    c.force_authenticate(user)
    return c


def running_lease(fleet: Fleet, node: Node) -> Lease:
    buyer = UserFactory()
    top_up(buyer, "50")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=10))
    fleet.play()
    lease = Lease.objects.get(order=order)
    assert lease.slice.gpu.node_id == node.pk and lease.state == Lease.State.RUNNING
    return lease


@pytest.mark.django_db
def test_a_node_is_renamed_through_the_api_and_a_name_in_use_is_a_409_naming_the_field():
    user = UserFactory()
    node, _ = node_with_token(provider=user, name="rack1")
    node_with_token(provider=user, name="rack2")
    c = provider_client(user)
    r = c.patch(f"/api/v1/nodes/{node.pk}/", {"name": "  rack1-h100  "}, format="json")
    assert r.status_code == 200 and r.json()["name"] == "rack1-h100"
    r = c.patch(f"/api/v1/nodes/{node.pk}/", {"name": "rack2", "cpus_per_gpu": "4"}, format="json")
    assert r.status_code == 409 and r.json()["error"]["fields"] == {"name": ["you already have a node named 'rack2'"]}
    node.refresh_from_db()
    assert node.name == "rack1-h100" and node.cpus_per_gpu == 8  # nothing of the refused PATCH was written
    r = c.patch(f"/api/v1/nodes/{node.pk}/", {"name": ""}, format="json")
    assert r.status_code == 400 and "name" in r.json()["error"]["fields"]
    r = c.patch(f"/api/v1/nodes/{node.pk}/", {"name": "rack9", "port_range_start": 30000, "port_range_end": 25000},
                format="json")
    assert r.status_code == 400 and "port_range_start" in r.json()["error"]["fields"]
    assert Node.objects.get(pk=node.pk).name == "rack1-h100"  # the rename went with the refused terms


@pytest.mark.django_db
def test_another_providers_node_cannot_be_renamed_or_deleted():
    node, _ = node_with_token(name="theirs")
    c = provider_client(UserFactory())
    assert c.patch(f"/api/v1/nodes/{node.pk}/", {"name": "mine"}, format="json").status_code == 404
    assert c.delete(f"/api/v1/nodes/{node.pk}/").status_code == 404
    node.refresh_from_db()
    assert node.name == "theirs" and node.status == Node.Status.PENDING


@pytest.mark.django_db
def test_a_node_with_an_open_lease_cannot_be_deleted_and_is_told_why():
    fleet = Fleet()
    node = fleet.node("a100-80gb:1")
    lease = running_lease(fleet, node)
    r = provider_client(node.provider).delete(f"/api/v1/nodes/{node.pk}/")
    assert r.status_code == 409, r.content
    error = r.json()["error"]
    assert error["code"] == "node_busy" and "1 open lease" in error["message"] and "drain" in error["message"]
    node.refresh_from_db()
    lease.refresh_from_db()
    assert node.status == Node.Status.ONLINE and lease.state == Lease.State.RUNNING


@pytest.mark.django_db
def test_a_node_with_a_future_reservation_cannot_be_deleted():
    fleet = Fleet()
    node = fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "200")
    start = timezone.now() + timedelta(hours=3)
    orders.order_place(buyer=buyer, spec=OrderSpec(mode="reserved", window_start=start,
                                                   window_end=start + timedelta(hours=1)))
    assert Reservation.objects.filter(gpu__node=node).exists()
    with pytest.raises(Conflict, match="1 reservation"):
        node_services.node_delete(node=node)
    assert Node.objects.get(pk=node.pk).status == Node.Status.ONLINE


@pytest.mark.django_db
def test_deleting_a_node_stops_its_token_hides_it_frees_its_name_and_keeps_its_earnings():
    fleet = Fleet()
    node = fleet.node("a100-80gb:1")
    provider = node.provider
    token_node, token = node_with_token(provider=provider, name="with-token")
    lease = running_lease(fleet, node)
    from marketplace.lifecycle import leases

    leases.lease_end(lease_id=lease.pk, buyer=lease.buyer, at=lease.started_at + timedelta(minutes=10))
    fleet.play()
    before = earnings(user=provider, month=None)
    c = provider_client(provider)
    assert c.delete(f"/api/v1/nodes/{node.pk}/").status_code == 204
    assert c.delete(f"/api/v1/nodes/{token_node.pk}/").status_code == 204
    node.refresh_from_db()
    assert node.status == Node.Status.DELETED
    assert HealthEvent.objects.filter(node=node, kind="deleted").exists()
    assert node_services.node_for_token(token=token) is None and node_services.node_agent_connect(token=token) is None
    assert c.get(f"/api/v1/nodes/{node.pk}/").status_code == 404
    assert str(node.pk) not in json.dumps(c.get("/api/v1/nodes/").json())
    assert c.get("/api/v1/gpus/").json()["count"] == 0
    # The name is free, and the money that names the node is still there, under its name.
    assert c.post("/api/v1/nodes/", {"name": node.name}, format="json").status_code == 201
    after = earnings(user=provider, month=None)
    assert after["nodes"] == before["nodes"] and after["nodes"][0]["node"]["name"] == node.name
    assert Lease.objects.get(pk=lease.pk).slice.gpu.node_id == node.pk
    # Deleting it again: not found among the provider's nodes (the service itself would change nothing).
    assert c.delete(f"/api/v1/nodes/{node.pk}/").status_code == 404
    assert node_services.node_delete(node=node).status == Node.Status.DELETED


@pytest.mark.django_db
def test_a_deleted_node_takes_no_new_order():
    fleet = Fleet()
    node = fleet.node("l4:1")
    node_services.node_delete(node=node)
    buyer = UserFactory()
    top_up(buyer, "50")
    with pytest.raises(DomainError) as refused:
        orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand"))
    assert refused.value.code == "unavailable"
    with pytest.raises(DomainError):
        orders.order_place(buyer=buyer, spec=OrderSpec(mode="reserved", window_start=timezone.now() + timedelta(hours=2),
                                                       window_end=timezone.now() + timedelta(hours=3)))
    assert not Order.objects.filter(state=Order.State.PLACED).exists()


@pytest.mark.django_db
def test_a_deleted_nodes_hello_is_refused_and_its_gpus_move_to_the_providers_new_node():
    provider = UserFactory()
    old, _ = node_with_token(provider=provider, name="old")
    backend = sim_backend("l4:2", hostname="box")
    node_services.node_hello(node_id=old.pk, frame=hello_from(backend))
    node_services.node_delete(node=old)
    with pytest.raises(DomainError) as refused:
        node_services.node_hello(node_id=old.pk, frame=hello_from(backend))
    assert refused.value.status == 401
    new, _ = node_with_token(provider=provider, name="old")  # the same server, registered again
    node_services.node_hello(node_id=new.pk, frame=hello_from(backend))
    assert Gpu.objects.filter(node=new, present=True).count() == 2
    assert HealthEvent.objects.filter(node=new, kind="gpu_moved", message__contains="(deleted)").count() == 2


@pytest.mark.django_db(transaction=True)
async def test_deleting_a_node_tells_its_connected_agent_and_closes_its_socket_4401():
    from tests.scheduler.test_gateway import connect_agent, expect_close

    node, token = await sync_to_async(node_with_token)()
    comm = await connect_agent(token, sim_backend("l4:1", hostname="gone"))
    await sync_to_async(node_services.node_delete)(node=node)
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["type"] == "error" and err["code"] == protocol.E_UNAUTHORISED and "deleted" in err["message"]
    await expect_close(comm, 4401)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_delete_racing_orders_never_leaves_a_lease_on_a_deleted_node():
    """Orders lock a GPU and re-check its node; the delete locks the node and its GPUs, then counts the leases:
    either the orders got leases and the delete is refused, or the delete won and no order got this node."""
    for attempt in range(4):
        fleet = Fleet()
        node = fleet.node("a100-80gb:1", price="1.00")
        buyers = [UserFactory() for _ in range(3)]
        for b in buyers:
            top_up(b, "50")

        def act(i):
            try:
                if i == 0:
                    return node_services.node_delete(node=Node.objects.get(pk=node.pk))
                return orders.order_place(buyer=buyers[i - 1], spec=OrderSpec(mode="on_demand", memory_gb=10))
            except DomainError as exc:
                return exc
            finally:
                connections.close_all()

        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(act, range(4)))
        node.refresh_from_db()
        on_node = Lease.objects.filter(slice__gpu__node=node, state__in=Lease.OPEN_STATES).count()
        if node.status == Node.Status.DELETED:
            assert on_node == 0, results
        else:
            assert isinstance(results[0], Conflict) and on_node >= 1, results


# --- the console ---------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_node_page_renames_the_node_and_keeps_a_refused_name_beside_the_field(client):
    user = UserFactory()
    node, _ = node_with_token(provider=user, name="a")
    node_with_token(provider=user, name="b")
    client.force_login(user)
    html = client.get(f"/nodes/{node.pk}/").content.decode()
    assert 'action="/nodes/{}/rename/"'.format(node.pk) in html and 'id="node-delete"' in html
    r = client.post(f"/nodes/{node.pk}/rename/", {"name": "b"})
    assert r.status_code == 400 and "already have a node named" in r.content.decode()
    assert 'value="b"' in r.content.decode()
    r = client.post(f"/nodes/{node.pk}/rename/", {"name": "c"})
    assert r.status_code == 302 and Node.objects.get(pk=node.pk).name == "c"


@pytest.mark.django_db
def test_the_console_asks_before_deleting_and_the_confirmation_deletes(client):
    user = UserFactory()
    node, _ = node_with_token(provider=user, name="old-box")
    client.force_login(user)
    page = client.get(f"/nodes/{node.pk}/delete/")
    html = page.content.decode()
    assert page.status_code == 200 and 'id="confirm-yes"' in html and "token stops working" in html
    assert Node.objects.get(pk=node.pk).status == Node.Status.PENDING  # looking at the question deletes nothing
    r = client.post(f"/nodes/{node.pk}/delete/", follow=True)
    assert r.redirect_chain == [("/nodes/", 302)] and "old-box is deleted" in r.content.decode()
    assert f"/nodes/{node.pk}/" not in r.content.decode()  # no longer listed
    assert Node.objects.get(pk=node.pk).status == Node.Status.DELETED
    assert client.get(f"/nodes/{node.pk}/").status_code == 404


@pytest.mark.django_db
def test_the_console_says_why_a_busy_node_cannot_be_deleted(client):
    fleet = Fleet()
    node = fleet.node("a100-80gb:1")
    running_lease(fleet, node)
    client.force_login(node.provider)
    html = client.get(f"/nodes/{node.pk}/delete/").content.decode()
    assert 'id="confirm-refused"' in html and "1 open lease" in html and 'id="confirm-yes"' not in html
    r = client.post(f"/nodes/{node.pk}/delete/", follow=True)
    assert "1 open lease" in r.content.decode()
    assert Node.objects.get(pk=node.pk).status == Node.Status.ONLINE
