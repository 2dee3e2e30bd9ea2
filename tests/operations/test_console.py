"""The Operations page: policies and rules set through its forms reach the services; bad input is shown beside its
field; the logs list what reclaim and the rules did; deleting asks first."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from marketplace.models import AutoscaleAction, AutoscaleRule, Project, ReclaimNotice, ReclaimPolicy
from marketplace.operations import autoscale, reclaim
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

POLICY = {"policy-project": "", "policy-idle_below_pct": "10", "policy-idle_minutes": "30",
          "policy-hours_start": "22:00", "policy-hours_end": "06:00", "policy-timezone": "Europe/Berlin",
          "policy-grace_minutes": "15", "policy-enabled": "on"}


def signed_in(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_a_policy_set_on_the_page_is_saved_and_saving_it_again_changes_it():
    buyer = UserFactory()
    c = signed_in(buyer)
    assert c.get("/operations/").status_code == 200
    r = c.post("/operations/reclaim/", POLICY)
    assert r.status_code == 302
    r = c.post("/operations/reclaim/", POLICY | {"policy-idle_below_pct": "3"}, follow=True)
    assert "Idle reclaim policy for your account&#x27;s default updated." in r.content.decode()
    policy = ReclaimPolicy.objects.get(user=buyer)
    assert policy.idle_below_pct == 3 and policy.timezone == "Europe/Berlin" and policy.project is None
    page = c.get("/operations/").content.decode()
    assert "22:00–06:00" in page and "all my leases (default)" in page


def test_a_bad_policy_is_shown_beside_its_field_and_nothing_is_saved():
    c = signed_in(UserFactory())
    r = c.post("/operations/reclaim/", POLICY | {"policy-idle_minutes": "0"})
    assert r.status_code == 400 and 'aria-invalid="true"' in r.content.decode()
    assert not ReclaimPolicy.objects.exists()


def test_a_rule_is_made_edited_and_deleted_after_a_confirmation_and_its_log_is_shown():
    buyer = UserFactory()
    project = Project.objects.create(user=buyer, name="inference")
    c = signed_in(buyer)
    form = {"rule-project": str(project.pk), "rule-name": "web", "rule-template": "", "rule-mode": "on_demand",
            "rule-gpu_model": "l4", "rule-whole_gpu": "on", "rule-memory_gb": "0", "rule-region": "",
            "rule-min_leases": "1", "rule-max_leases": "3", "rule-scale_out_pct": "70", "rule-scale_out_minutes": "5",
            "rule-scale_in_pct": "20", "rule-scale_in_minutes": "10", "rule-scale_out_cooldown_seconds": "300",
            "rule-scale_in_cooldown_seconds": "600", "rule-enabled": "on"}
    assert c.post("/operations/rules/", form).status_code == 302
    rule = AutoscaleRule.objects.get(project=project)
    assert rule.gpu_models == ["l4"] and rule.whole_gpu and rule.max_leases == 3
    assert 'value="web"' in c.get(f"/operations/rules/{rule.pk}/").content.decode()
    r = c.post(f"/operations/rules/{rule.pk}/", form | {"rule-scale_in_pct": "90"})
    assert r.status_code == 400 and "a gap between them" in r.content.decode()
    c.post(f"/operations/rules/{rule.pk}/", form | {"rule-max_leases": "5"})
    rule.refresh_from_db()
    assert rule.max_leases == 5
    AutoscaleAction.objects.create(rule=rule, at=timezone.now(), kind="refused", leases_before=0,
                                   reason="1 lease(s), below the minimum of 1; the market refused the order: none")
    assert "the market refused the order" in c.get("/operations/").content.decode()
    assert "Delete the autoscaling rule" in c.get(f"/operations/rules/{rule.pk}/delete/").content.decode()
    assert AutoscaleRule.objects.filter(pk=rule.pk).exists()  # asking changes nothing
    c.post(f"/operations/rules/{rule.pk}/delete/")
    assert not AutoscaleRule.objects.filter(pk=rule.pk).exists()


def test_someone_elses_rule_is_not_shown_or_changed():
    owner = UserFactory()
    project = Project.objects.create(user=owner, name="p")
    rule = autoscale.autoscale_rule_save(user=owner, project_id=project.pk, name="web")
    c = signed_in(UserFactory())
    assert c.get(f"/operations/rules/{rule.pk}/").status_code == 302
    c.post(f"/operations/rules/{rule.pk}/delete/")
    assert AutoscaleRule.objects.filter(pk=rule.pk).exists()
    assert "web" not in c.get("/operations/").content.decode().split('id="rule-list"')[1].split("</table>")[0]


def test_the_reclaim_log_shows_the_money_saved():
    from tests.marketplace.marketsim import Fleet, top_up
    from marketplace.products import orders
    from marketplace.products.orders import OrderSpec
    from marketplace.models import Lease

    fleet = Fleet()
    fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "50")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", gpu_models=["l4"]))
    fleet.play()
    lease = Lease.objects.get(order=order)
    policy = reclaim.reclaim_policy_save(user=buyer, idle_below_pct=5, idle_minutes=5,
                                         hours_start=timezone.now().time(), hours_end=timezone.now().time())
    now = timezone.now()
    ReclaimNotice.objects.create(policy=policy, lease=lease, state="reclaimed", noticed_at=now, act_at=now,
                                 acted_at=now + timedelta(minutes=10), util_pct=1.0, saved=Decimal("12.345678"),
                                 reason="idle below 5% (at most 1%) for 5 min and after the notice")
    page = signed_in(buyer).get("/operations/").content.decode()
    assert 'id="saved-total">$12.35<' in page and "after the notice" in page
