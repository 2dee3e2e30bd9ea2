"""The operations API: reclaim policies and notices, autoscaling rules, queue reports and the action log; scopes
(trade to write, read to read), someone else's rules, bad input, and list queries."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from marketplace.models import Project
from marketplace.operations import autoscale
from marketplace.products.apikeys import api_key_create
from tests.factories import UserFactory
from tests.marketplace.marketsim import Fleet, top_up

pytestmark = pytest.mark.django_db

POLICY = {"idle_below_pct": 10, "idle_minutes": 30, "hours_start": "22:00", "hours_end": "06:00",
          "timezone": "Europe/Berlin", "grace_minutes": 15}


def client_for(user, scopes=None) -> APIClient:
    c = APIClient()
    _, key = api_key_create(user=user, name="ops", **({"scopes": scopes} if scopes else {}))
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return c


def test_a_reclaim_policy_is_made_read_and_edited_with_a_trade_key_and_only_read_with_a_read_key():
    buyer = UserFactory()
    c = client_for(buyer)
    r = c.post("/api/v1/reclaim-policies/", POLICY, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["project"] is None and body["hours_start"] == "22:00:00" and body["timezone"] == "Europe/Berlin"
    r = c.patch(f"/api/v1/reclaim-policies/{body['id']}/", {"idle_below_pct": 5}, format="json")
    assert r.status_code == 200 and r.json()["idle_below_pct"] == 5 and r.json()["idle_minutes"] == 30
    assert c.post("/api/v1/reclaim-policies/", POLICY, format="json").status_code == 409  # one default
    reader = client_for(buyer, scopes=["read"])
    assert reader.get("/api/v1/reclaim-policies/").json()["count"] == 1
    r = reader.post("/api/v1/reclaim-policies/", POLICY, format="json")
    assert r.status_code == 403 and r.json()["error"]["code"] == "missing_scope"
    assert reader.get("/api/v1/reclaim-notices/").status_code == 200


@pytest.mark.parametrize("field,value", [("timezone", "Nowhere/Land"), ("idle_below_pct", 0),
                                         ("hours_start", "25:00")])
def test_a_bad_policy_is_refused_naming_the_field(field, value):
    r = client_for(UserFactory()).post("/api/v1/reclaim-policies/", POLICY | {field: value}, format="json")
    assert r.status_code == 400 and field in str(r.json()), r.content


def test_an_autoscaling_rule_is_made_reports_its_queue_and_lists_its_leases_and_actions_in_few_queries():
    fleet = Fleet()
    fleet.node("l4:3")
    buyer = UserFactory()
    top_up(buyer, "100")
    project = Project.objects.create(user=buyer, name="inference")
    c = client_for(buyer)
    rule = {"project": project.pk, "name": "web", "gpu_models": ["l4"], "whole_gpu": True, "min_leases": 1,
            "max_leases": 3, "scale_out_pct": 70, "scale_out_minutes": 2, "scale_in_pct": 20, "scale_in_minutes": 5,
            "scale_out_queue": 10, "scale_out_cooldown_seconds": 0}
    r = c.post("/api/v1/autoscale-rules/", rule, format="json")
    assert r.status_code == 201, r.content
    rule_id = r.json()["id"]
    assert c.post("/api/v1/autoscale-rules/", rule, format="json").status_code == 409  # the name is taken
    autoscale.autoscale_tick()
    fleet.play()
    r = c.post(f"/api/v1/autoscale-rules/{rule_id}/queue/", {"length": 12}, format="json")
    assert r.status_code == 200 and r.json()["queue_length"] == 12
    autoscale.autoscale_tick()
    for name in ("batch", "train"):
        autoscale.autoscale_rule_save(user=buyer, project_id=project.pk, **(rule | {"name": name, "min_leases": 0}))
    with CaptureQueriesContext(connection) as queries:
        listed = c.get("/api/v1/autoscale-rules/").json()
    assert len(queries) <= 8, [q["sql"] for q in queries]
    web = next(x for x in listed["results"] if x["name"] == "web")
    assert len(web["leases"]) == 2
    actions = c.get("/api/v1/autoscale-actions/").json()["results"]
    assert [a["kind"] for a in actions] == ["scale_out", "scale_out"]
    assert "queue is 12" in actions[0]["reason"]


def test_someone_elses_rule_and_project_look_missing():
    owner, other = UserFactory(), UserFactory()
    project = Project.objects.create(user=owner, name="p")
    rule = autoscale.autoscale_rule_save(user=owner, project_id=project.pk, name="web")
    c = client_for(other)
    assert c.get(f"/api/v1/autoscale-rules/{rule.pk}/").status_code == 404
    assert c.post(f"/api/v1/autoscale-rules/{rule.pk}/queue/", {"length": 3}, format="json").status_code == 404
    r = c.post("/api/v1/autoscale-rules/", {"project": project.pk, "name": "mine"}, format="json")
    assert r.status_code == 404
    r = c.post("/api/v1/autoscale-rules/", {"project": project.pk + 100, "name": "x"}, format="json")
    assert r.status_code == 404  # a project that is nobody's


def test_a_rule_is_changed_with_patch_and_a_gapless_threshold_pair_is_refused():
    buyer = UserFactory()
    project = Project.objects.create(user=buyer, name="p")
    rule = autoscale.autoscale_rule_save(user=buyer, project_id=project.pk, name="web", template="vllm")
    c = client_for(buyer)
    r = c.patch(f"/api/v1/autoscale-rules/{rule.pk}/", {"max_leases": 6, "template": ""}, format="json")
    assert r.status_code == 200 and r.json()["max_leases"] == 6 and r.json()["template"] is None
    r = c.patch(f"/api/v1/autoscale-rules/{rule.pk}/", {"scale_in_pct": 95}, format="json")
    assert r.status_code == 400 and "scale_in_pct" in r.json()["error"]["fields"], r.content
    assert c.delete(f"/api/v1/autoscale-rules/{rule.pk}/").status_code == 204
