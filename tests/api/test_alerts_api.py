"""Alerts over the REST API: the user's own alerts only (filtered by state, a bounded number of queries), and alert
rules made, changed and removed with the `trade` scope, read with `read`."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from marketplace.lifecycle.alerts import alert_fire, alert_resolve
from marketplace.models import AlertRule, Project
from marketplace.products.apikeys import api_key_create
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def with_key(user, *scopes) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(user=user, name='k', scopes=scopes)[1]}")
    return c


def test_the_alert_list_shows_only_mine_filters_by_state_in_a_fixed_number_of_queries():
    me, other = UserFactory(), UserFactory()
    for i in range(5):
        alert_fire(user=me, kind="other", subject_key=f"k{i}", title=f"alert {i}")
    alert_resolve(user=me, subject_key="k0")
    alert_fire(user=other, kind="other", subject_key="theirs", title="not yours")
    client = with_key(me, "read")
    with CaptureQueriesContext(connection) as queries:
        body = client.get("/api/v1/alerts/?state=firing").json()
    assert len(queries) <= 6
    assert sorted(a["title"] for a in body["results"]) == [f"alert {i}" for i in range(1, 5)]
    resolved = client.get("/api/v1/alerts/?state=resolved").json()["results"]
    assert [a["subject_key"] for a in resolved] == ["k0"] and resolved[0]["resolved_at"]
    assert client.get("/api/v1/alerts/?state=nonsense").status_code == 400


def test_rules_are_made_changed_and_removed_with_the_trade_scope_and_refused_with_reasons():
    me = UserFactory()
    project = Project.objects.create(user=me, name="p")
    reader, trader = with_key(me, "read"), with_key(me, "read", "trade")
    r = reader.post("/api/v1/alert-rules/", {"kind": "spend"}, format="json")
    assert r.status_code == 403 and r.json()["error"]["details"] == {"scope": "trade"}
    r = trader.post("/api/v1/alert-rules/", {"kind": "spend", "project": project.pk,
                                             "params": {"percents": [90, 75]}}, format="json")
    assert r.status_code == 201, r.json()
    rule = r.json()
    assert rule["params"] == {"percents": [75, 90]} and rule["project"] == project.pk and rule["email"] is True
    r = trader.post("/api/v1/alert-rules/", {"kind": "spend", "project": project.pk}, format="json")
    assert r.status_code == 409
    r = trader.patch(f"/api/v1/alert-rules/{rule['id']}/", {"params": {"percents": [0]}}, format="json")
    assert r.status_code == 400 and "percents" in r.json()["error"]["message"]
    r = trader.patch(f"/api/v1/alert-rules/{rule['id']}/", {"enabled": False}, format="json")
    assert r.status_code == 200 and r.json()["enabled"] is False
    other_project = Project.objects.create(user=UserFactory(), name="theirs")
    r = trader.post("/api/v1/alert-rules/", {"kind": "spend", "project": other_project.pk}, format="json")
    assert r.status_code == 404
    assert trader.delete(f"/api/v1/alert-rules/{rule['id']}/").status_code == 204
    assert not AlertRule.objects.exists()
