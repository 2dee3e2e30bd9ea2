"""Console pages of the TCO calculator and the reliability score, with the Django test client: the calculator works
without a script and keeps what was typed; the node page and the admin show the formula with each component's
value, weight and events; a buyer reports a failed lease from its page, once."""
from __future__ import annotations

import pytest

from marketplace.models import Lease, LeaseFailureReport
from marketplace.products import orders
from marketplace.products.orders import OrderSpec
from scheduler.models import Gpu
from scheduler.services import health as health_services
from scheduler.services.reliability import reliability_recompute
from tests.factories import UserFactory
from tests.marketplace.marketsim import Fleet, top_up

pytestmark = pytest.mark.django_db


def test_the_tco_page_shows_defaults_then_compares_the_seeds_plan(client):
    client.force_login(UserFactory())
    r = client.get("/tco/")
    assert r.status_code == 200
    body = r.content.decode()
    assert 'id="tco-chart"' in body and 'name="pue" value="1.4"' in body
    r = client.get("/tco/", {"gpu_model": "h100-80gb", "gpus": 8, "hours_per_day": 24, "days": 30,
                             "hardware_price_per_gpu": 6000, "depreciation_months": 1, "power_watts_per_gpu": 0,
                             "hosting_per_gpu_month": 0, "on_demand_per_gpu_hour": "5.555556",
                             "reserved_per_gpu_hour": "4.861111"})
    body = r.content.decode()
    assert "$48,000.00" in body and "$32,000.00" in body and "$28,000.00" in body


def test_a_bad_tco_input_is_shown_beside_its_field_and_kept(client):
    client.force_login(UserFactory())
    r = client.get("/tco/", {"gpus": "0", "days": "30"})
    assert r.status_code == 400
    body = r.content.decode()
    assert 'id="id_gpus_error"' in body and 'name="days" value="30"' in body


def test_the_node_page_and_the_admin_show_the_formula_its_components_and_events(client, admin_client):
    fleet = Fleet()
    node = fleet.node("a100-80gb:1")
    gpu = Gpu.objects.get(node=node)
    health_services.health_event_record(node_id=node.pk, gpu_uuid=gpu.uuid, kind="xid", message="XID 79",
                                        detail={"codes": [79]})
    reliability_recompute(node_ids=[node.pk])
    client.force_login(node.provider)
    body = client.get(f"/nodes/{node.pk}/").content.decode()
    assert 'id="reliability-formula"' in body and "0.25 × 0.667 (health)" in body
    assert 'data-component="health"' in body and "xid:79 1" in body
    admin = admin_client.get(f"/admin/scheduler/node/{node.pk}/change/").content.decode()
    assert "0.25 × 0.667 (health)" in admin


def test_a_buyer_reports_a_failed_lease_from_its_page_once(client):
    fleet = Fleet()
    fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "20")
    client.force_login(buyer)
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand"))
    fleet.play()
    lease = Lease.objects.get(order=order)
    assert 'id="report-failure"' in client.get(f"/leases/{lease.pk}/").content.decode()
    url = f"/leases/{lease.pk}/report-failure/"
    r = client.post(url, {"reason": "gpu_error", "note": "illegal memory access"}, follow=True)
    body = r.content.decode()
    assert 'id="failure-reported"' in body and "illegal memory access" in body
    client.post(url, {"reason": "other"})
    assert LeaseFailureReport.objects.get().reason == "gpu_error"
    other = UserFactory()
    client.force_login(other)
    assert client.post(url, {"reason": "other"}).status_code == 404
