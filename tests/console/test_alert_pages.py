"""The console's alerts: the bell's count in every page's top bar, the list (firing first, with suggestions), and
the rules page (the defaults shown, a rule saved, a bad value refused beside its field, a project's rule)."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from marketplace.lifecycle.alerts import alert_fire, alert_resolve
from marketplace.models import AlertRule, Project
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_the_bell_counts_my_firing_alerts_on_every_page_and_the_list_shows_them(client, buyer):
    alert_fire(user=buyer, kind="oom_risk", subject_key="a", title="Lease 1234abcd is close to running out",
               detail="It used 38 of 40 GB.", suggestion={"text": "7g.80gb for $6.48/h"})
    alert_fire(user=buyer, kind="other", subject_key="b", title="Old news")
    alert_resolve(user=buyer, subject_key="b")
    alert_fire(user=UserFactory(), kind="other", subject_key="c", title="Someone else's")
    page = client.get("/catalog/").content.decode()
    assert 'aria-label="Alerts: 1 firing"' in page and '<span class="count">1</span>' in page
    with CaptureQueriesContext(connection) as ctx:
        r = client.get("/alerts/")
    assert r.status_code == 200 and len(ctx.captured_queries) <= 8
    page = r.content.decode()
    assert "close to running out" in page and "7g.80gb for $6.48/h" in page and "Old news" in page
    assert "Someone else" not in page
    firing_only = client.get("/alerts/?state=firing").content.decode()
    assert "Old news" not in firing_only


def test_the_rules_page_shows_the_defaults_and_saves_a_rule_and_refuses_a_bad_value(client, buyer):
    page = client.get("/alerts/rules/").content.decode()
    assert 'value="30"' in page and 'value="15"' in page and 'value="50, 80, 100"' in page and 'value="24"' in page
    r = client.post("/alerts/rules/", {"kind": "underused", "underused-util_below_percent": "20",
                                       "underused-minutes": "", "underused-enabled": "on"})
    assert r.status_code == 302
    rule = AlertRule.objects.get(user=buyer, kind="underused")
    assert rule.params == {"util_below_percent": 20, "minutes": 15} and rule.enabled and not rule.email
    r = client.post("/alerts/rules/", {"kind": "spend", "spend-percents": "50, lots", "spend-enabled": "on"})
    assert r.status_code == 400 and "whole percentages" in r.content.decode()
    r = client.post("/alerts/rules/", {"kind": "spend", "spend-percents": "0", "spend-enabled": "on"})
    assert r.status_code == 400 and "percents is a list" in r.content.decode()
    assert not AlertRule.objects.filter(kind="spend").exists()


def test_a_project_rule_is_saved_listed_and_removed(client, buyer):
    project = Project.objects.create(user=buyer, name="vision")
    r = client.post("/alerts/rules/", {"kind": "spend", "project": project.pk, "project-percents": "90",
                                       "project-enabled": "on", "project-email": "on"})
    assert r.status_code == 302
    rule = AlertRule.objects.get(project=project)
    assert rule.params == {"percents": [90]}
    assert "project vision" in client.get("/alerts/rules/").content.decode()
    assert client.post(f"/alerts/rules/{rule.pk}/delete/").status_code == 302
    assert not AlertRule.objects.exists()
    other = Project.objects.create(user=UserFactory(), name="theirs")
    r = client.post("/alerts/rules/", {"kind": "spend", "project": other.pk, "project-enabled": "on"})
    assert r.status_code == 400 and not AlertRule.objects.exists()


def test_operators_see_alerts_and_rules_in_the_admin_without_changing_them(client):
    staff = UserFactory(username="op", is_staff=True, is_superuser=True)
    alert_fire(user=UserFactory(), kind="other", subject_key="x", title="Seen by operators")
    AlertRule.objects.create(user=staff, kind="spend", params={"percents": [50]})
    client.force_login(staff)
    assert "Seen by operators" in client.get("/admin/marketplace/alert/").content.decode()
    assert client.get("/admin/marketplace/alertrule/").status_code == 200
    assert client.get("/admin/marketplace/alert/add/").status_code == 403
