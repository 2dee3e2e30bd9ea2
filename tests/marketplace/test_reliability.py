"""The reliability score on the database: components from recorded events (heartbeats, slice commands, health
events, leases the node took down, buyers' reports), stored per node and GPU, used by the catalog's filter and the
scheduler; a buyer reports a failed lease through the API."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.claims import snapshot
from marketplace.lifecycle import leases
from marketplace.models import Lease, LeaseFailureReport
from marketplace.products import catalog, orders
from marketplace.products.orders import OrderSpec
from scheduler.models import Gpu, HealthEvent, Node
from scheduler.services import health as health_services
from scheduler.services.reliability import reliability_recompute
from tests.factories import UserFactory, client_for
from tests.marketplace.marketsim import top_up

pytestmark = pytest.mark.django_db



def parts(detail: dict) -> dict:
    return {c["name"]: c for c in detail["components"]}


def running_lease(fleet, buyer, **spec) -> Lease:
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", **spec))
    fleet.play()
    return Lease.objects.get(order=order)


def test_uptime_comes_from_the_nodes_offline_and_online_events(fleet):
    node = fleet.node("l4:1")
    now = timezone.now()
    HealthEvent.objects.filter(node=node).delete()
    for kind, hours_ago in (("connected", 10), ("offline", 4), ("online", 3)):
        e = HealthEvent.objects.create(node=node, kind=kind, message=kind)
        HealthEvent.objects.filter(pk=e.pk).update(created_at=now - timedelta(hours=hours_ago))
    reliability_recompute(node_ids=[node.pk], now=now)
    node.refresh_from_db()
    uptime = parts(node.reliability_detail)["uptime"]
    assert uptime["value"] == pytest.approx(0.9)
    assert uptime["events"] == {"online_seconds": 9 * 3600, "window_seconds": 10 * 3600}
    assert node.reliability == pytest.approx(1 - 0.30 * 0.1, abs=1e-4)


def test_a_gpu_with_xids_scores_lower_than_its_sibling_and_its_node_counts_both(fleet):
    node = fleet.node("a100-80gb:2")
    bad, good = Gpu.objects.filter(node=node).order_by("index")
    for code in (79, 79, 13):
        health_services.health_event_record(node_id=node.pk, gpu_uuid=bad.uuid, kind="xid", message=f"XID {code}",
                                            detail={"codes": [code]})
    health_services.gpu_cordon(gpu_id=bad.pk, reason="temperature 95 °C ≥ 90 °C; XID 79")
    reliability_recompute(node_ids=[node.pk])
    bad.refresh_from_db(), good.refresh_from_db(), node.refresh_from_db()
    assert good.reliability == 1.0 and bad.reliability < good.reliability
    health = parts(bad.reliability_detail)["health"]
    assert health["events"]["xid:79"] == 2 and health["events"]["xid:13"] == 1 and health["events"]["thermal"] == 1
    assert health["value"] == pytest.approx(1 / (1 + 2 * 0.5 + 0.05), abs=1e-4)
    assert node.reliability == pytest.approx(bad.reliability, abs=1e-4)  # the node holds the same events
    assert "(health)" in node.reliability_detail["formula"]


def test_a_health_event_rescores_its_node_after_commit(fleet, django_capture_on_commit_callbacks):
    node = fleet.node("l4:1")
    gpu = Gpu.objects.get(node=node)
    with django_capture_on_commit_callbacks(execute=True):
        health_services.health_event_record(node_id=node.pk, gpu_uuid=gpu.uuid, kind="xid", message="XID 48",
                                            detail={"codes": [48]})
    gpu.refresh_from_db()
    assert gpu.reliability == pytest.approx(1 - 0.25 * (1 - 1 / 1.3), abs=1e-4)


def test_failed_slice_commands_lower_provisioning_and_lost_leases_count_as_interruptions(fleet):
    node = fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "50")
    orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=10))
    fleet.play(fail_creates=True)
    lease = running_lease(fleet, buyer, memory_gb=10)
    leases.lease_end(lease_id=lease.pk, reason="node offline")
    reliability_recompute(node_ids=[node.pk])
    node.refresh_from_db()
    p = parts(node.reliability_detail)
    assert p["provisioning"]["events"]["failed"] == 1 and p["provisioning"]["value"] < 1
    assert p["interruptions"]["events"] == {"caused": 2, "leases_hosted": 2}  # provisioning failed, node offline
    assert p["interruptions"]["value"] == 0.0


def test_a_buyer_reports_a_failed_lease_once_and_it_counts_against_that_gpu(fleet, django_capture_on_commit_callbacks):
    node = fleet.node("l4:2")
    buyer, other = UserFactory(), UserFactory()
    top_up(buyer, "50")
    lease = running_lease(fleet, buyer)
    c = client_for(buyer)
    url = f"/api/v1/leases/{lease.pk}/report-failure/"
    assert client_for(other).post(url, {"reason": "gpu_error"}, format="json").status_code == 404
    assert c.post(url, {"reason": "broken"}, format="json").status_code == 400
    with django_capture_on_commit_callbacks(execute=True):
        r = c.post(url, {"reason": "gpu_error", "note": "CUDA error: an illegal memory access"}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["reason"] == "gpu_error"
    again = c.post(url, {"reason": "other"}, format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_reported"
    assert LeaseFailureReport.objects.count() == 1
    reported = lease.slice.gpu
    reported.refresh_from_db()
    sibling = Gpu.objects.filter(node=node).exclude(pk=reported.pk).get()
    assert parts(reported.reliability_detail)["buyer_reports"]["events"] == {"reported_failed": 1, "leases_hosted": 1}
    assert reported.reliability < 1.0 and sibling.reliability in (None, 1.0)


def test_the_catalogs_reliability_filter_reads_each_gpus_own_score(fleet):
    node = fleet.node("l4:2")
    bad = Gpu.objects.filter(node=node).order_by("index").first()
    for _ in range(4):
        health_services.health_event_record(node_id=node.pk, gpu_uuid=bad.uuid, kind="xid", message="XID 79",
                                            detail={"codes": [79]})
    reliability_recompute(node_ids=[node.pk])
    Node.objects.filter(pk=node.pk).update(reliability=0.5)  # the node's own number is not what the filter reads
    snapshot.forget()
    offers = catalog.offer_list(filters=catalog.Filters(gpu_model="l4", min_reliability=0.95))
    assert [o.gpus for o in offers] == [1]
    assert offers[0].reliability == 1.0


def test_the_beat_scores_every_node_in_chunks_with_a_fixed_number_of_queries(fleet, monkeypatch,
                                                                              django_assert_max_num_queries):
    from scheduler.services import reliability
    for _ in range(3):
        fleet.node("l4:2")
    monkeypatch.setattr(reliability, "CHUNK", 2)
    with django_assert_max_num_queries(30):
        assert reliability.reliability_recompute() == 3
    assert Node.objects.filter(reliability_at__isnull=False).count() == 3
    assert Gpu.objects.filter(reliability=1.0).count() == 6


def test_a_burst_of_xids_rescores_its_node_once_at_the_first_event_and_once_for_the_rest(fleet, monkeypatch,
                                                                                       django_capture_on_commit_callbacks):
    from scheduler.services import reliability

    node = fleet.node("a100-80gb:1")
    gpu = Gpu.objects.get(node=node)
    scored = []
    real = reliability.reliability_recompute
    monkeypatch.setattr(reliability, "reliability_recompute",
                        lambda **kw: scored.append(kw["node_ids"]) or real(**kw))

    def xid():
        with django_capture_on_commit_callbacks(execute=True):
            health_services.health_event_record(node_id=node.pk, gpu_uuid=gpu.uuid, kind="xid", message="XID 79",
                                                detail={"codes": [79]})

    for _ in range(6):
        xid()
    # the first event now; the second queues one rescore for the end of the window (run at once where tasks are
    # eager), which reads the whole burst; the other four cost nothing
    assert scored == [[node.pk], [str(node.pk)]]
    gpu.refresh_from_db()
    assert parts(gpu.reliability_detail)["health"]["events"]["xid:79"] >= 2
    from django.core.cache import cache

    cache.delete_many([f"reliability:rescored:{node.pk}", f"reliability:due:{node.pk}"])  # the window has passed
    xid()
    assert len(scored) == 3
