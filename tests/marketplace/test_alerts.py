"""Alert rules on synthetic metrics rollups, spend and burn rate, with exact firing and resolving times; one firing
alert per subject; delivery by e-mail (a local SMTP server) and webhook (a local receiver, SSRF rules in place)."""
from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta, timezone as tz
from decimal import Decimal

import pytest
from django.db import IntegrityError, close_old_connections

from marketplace import notifications
from marketplace.lifecycle.alerts import alert_fire, alert_resolve
from marketplace.models import Alert, AlertRule, Lease, Project, UsageRecord
from marketplace.pricing import price_for
from marketplace.products import alerts, orders
from marketplace.products.orders import OrderSpec
from scheduler.errors import Conflict, DomainError
from scheduler.models import Gpu, GpuMetricRollup
from tests.factories import UserFactory
from tests.mailserver import body
from tests.marketplace.marketsim import Fleet, top_up
from tests.webhookserver import Hook

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=tz.utc)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.fixture
def lease():
    """A running on-demand 3g.40gb lease (alone on its H100), started at T0."""
    fleet = Fleet()
    fleet.node("h100-80gb:1", price="2.00")
    buyer = UserFactory(email="buyer@example.org")
    top_up(buyer, "1000")
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=40))
    fleet.play()
    lease = Lease.objects.select_related("slice__gpu").get(order=order)
    assert lease.state == Lease.State.RUNNING and lease.slice.profile == "3g.40gb"
    Lease.objects.filter(pk=lease.pk).update(started_at=T0)
    lease.refresh_from_db()
    return lease


def minutes(gpu_id, first: int, last: int, *, util=10.0, util_max=None, mem_gib=5.0, temp=60.0, power=200.0):
    """Rollups of minutes T0+first .. T0+last (inclusive), as the gateway writes them."""
    GpuMetricRollup.objects.bulk_create([GpuMetricRollup(
        gpu_id=gpu_id, minute=at(m), samples=60, util_min=util, util_avg=util,
        util_max=util if util_max is None else util_max, mem_used_min=mem_gib * 1024, mem_used_avg=mem_gib * 1024,
        mem_used_max=mem_gib * 1024, temp_min=temp, temp_avg=temp, temp_max=temp, power_min=power,
        power_avg=power, power_max=power) for m in range(first, last + 1)])


def firing(user, kind):
    return list(Alert.objects.filter(user=user, kind=kind, state=Alert.State.FIRING))


def test_underused_fires_after_exactly_15_quiet_minutes_suggests_a_smaller_profile_and_resolves_when_busy(lease):
    gpu = lease.slice.gpu
    minutes(gpu.pk, 0, 14, util=10.0, util_max=12.0, mem_gib=5.0)
    alerts.alerts_evaluate(now=at(14) + timedelta(seconds=59))  # minute 14 is still running: 14 complete minutes
    assert firing(lease.buyer, "underused") == []
    alerts.alerts_evaluate(now=at(15))
    [alert] = firing(lease.buyer, "underused")
    assert alert.fired_at == at(15) and alert.lease_id == lease.pk and "10%" in alert.title
    # The last hour's peak: 5 GB and 12% of 3 compute slices (one) -> 1g.10gb; its price from the one price function.
    geometry = Gpu.objects.get(pk=gpu.pk).geometry()
    mine = price_for(mode="on_demand", base_per_gpu_hour=Decimal("2.00"), geometry=geometry, profile="3g.40gb")
    small = price_for(mode="on_demand", base_per_gpu_hour=Decimal("2.00"), geometry=geometry, profile="1g.10gb")
    assert alert.suggestion["profile"] == "1g.10gb"
    assert Decimal(alert.suggestion["saves_per_hour"]) == mine - small > 0
    minutes(gpu.pk, 15, 15, util=10.0)
    alerts.alerts_evaluate(now=at(16))
    assert Alert.objects.filter(kind="underused").count() == 1  # de-duplicated: still the one alert
    minutes(gpu.pk, 16, 16, util=55.0)
    alerts.alerts_evaluate(now=at(16) + timedelta(seconds=30))  # minute 16 is not complete yet
    assert firing(lease.buyer, "underused") == [alert]
    alerts.alerts_evaluate(now=at(17))
    alert.refresh_from_db()
    assert alert.state == "resolved" and alert.resolved_at == at(17)


def test_one_busy_minute_in_the_window_keeps_underused_quiet_and_a_rule_can_lower_the_threshold(lease):
    minutes(lease.slice.gpu_id, 0, 14, util=20.0)
    GpuMetricRollup.objects.filter(minute=at(7)).update(util_avg=35.0)
    alerts.alerts_evaluate(now=at(15))
    assert firing(lease.buyer, "underused") == []
    GpuMetricRollup.objects.filter(minute=at(7)).update(util_avg=20.0)
    alerts.rule_create(user=lease.buyer, kind="underused", lease_id=lease.pk, params={"util_below_percent": 15})
    alerts.alerts_evaluate(now=at(15))
    assert firing(lease.buyer, "underused") == []  # 20% is busy enough under this lease's own rule
    AlertRule.objects.filter(lease=lease).update(params={"util_below_percent": 30, "minutes": 5})
    alerts.alerts_evaluate(now=at(15))
    assert len(firing(lease.buyer, "underused")) == 1


def test_oom_risk_fires_at_95_percent_of_the_slice_suggests_the_next_larger_profile_and_resolves_below(lease):
    gpu = lease.slice.gpu
    minutes(gpu.pk, 0, 0, util=90.0, mem_gib=40 * 0.94)
    alerts.alerts_evaluate(now=at(1))
    assert firing(lease.buyer, "oom_risk") == []
    minutes(gpu.pk, 1, 1, util=90.0, mem_gib=40 * 0.96)
    alerts.alerts_evaluate(now=at(2))
    [alert] = firing(lease.buyer, "oom_risk")
    assert alert.fired_at == at(2) and alert.suggestion["profile"] == "7g.80gb" and "96%" in alert.title
    minutes(gpu.pk, 2, 2, util=90.0, mem_gib=20)
    alerts.alerts_evaluate(now=at(3))
    alert.refresh_from_db()
    assert alert.state == "resolved" and alert.resolved_at == at(3)


def test_a_lease_that_ends_has_its_alerts_resolved(lease):
    minutes(lease.slice.gpu_id, 0, 0, mem_gib=39)
    alerts.alerts_evaluate(now=at(1))
    assert len(firing(lease.buyer, "oom_risk")) == 1
    Lease.objects.filter(pk=lease.pk).update(state=Lease.State.ENDED)
    alerts.alerts_evaluate(now=at(2))
    assert firing(lease.buyer, "oom_risk") == []


def test_an_overheating_gpu_alerts_its_provider_and_the_buyer_on_it_and_resolves_when_cool(lease, settings):
    gpu = lease.slice.gpu
    provider = gpu.node.provider
    minutes(gpu.pk, 0, 0, temp=settings.FLEET["MAX_TEMPERATURE_C"] + 2)
    alerts.alerts_evaluate(now=at(1))
    [mine], [theirs] = firing(provider, "gpu_health"), firing(lease.buyer, "gpu_health")
    assert "temperature" in mine.title and mine.severity == "critical" and theirs.lease_id == lease.pk
    minutes(gpu.pk, 1, 1, temp=60)
    alerts.alerts_evaluate(now=at(2))
    assert firing(provider, "gpu_health") == [] and firing(lease.buyer, "gpu_health") == []
    assert Alert.objects.get(user=provider).resolved_at == at(2)


def test_a_gpu_the_health_check_cordoned_for_an_xid_alerts_its_provider_and_the_buyer_on_it(lease):
    Gpu.objects.filter(pk=lease.slice.gpu_id).update(health="cordoned", cordoned_by="health",
                                                     health_reason="XID 79 (health check)")
    alerts.alerts_evaluate(now=at(1))
    [alert] = firing(lease.slice.gpu.node.provider, "gpu_health")
    assert "XID 79" in alert.title
    [buyers] = firing(lease.buyer, "gpu_health")
    assert buyers.lease_id == lease.pk and "XID 79" in buyers.title


def test_a_minute_drawing_over_the_power_threshold_alerts_and_one_under_it_does_not(lease, settings):
    gpu = lease.slice.gpu
    tdp = gpu.gpu_model.tdp_w
    share = settings.FLEET["POWER_CORDON_SHARE"]
    minutes(gpu.pk, 0, 0, power=share * tdp - 1)  # under the threshold for the whole minute
    alerts.alerts_evaluate(now=at(1))
    assert firing(gpu.node.provider, "gpu_health") == []
    minutes(gpu.pk, 1, 1, power=share * tdp + 5)
    alerts.alerts_evaluate(now=at(2))
    [mine] = firing(gpu.node.provider, "gpu_health")
    assert "power" in mine.title and firing(lease.buyer, "gpu_health")[0].lease_id == lease.pk
    minutes(gpu.pk, 2, 2, power=tdp * 0.5)
    alerts.alerts_evaluate(now=at(3))
    assert firing(gpu.node.provider, "gpu_health") == [] and firing(lease.buyer, "gpu_health") == []


def _usage(project, amount, minute):
    UsageRecord.objects.create(lease_id=uuid.uuid4(), buyer=project.user, provider=UserFactory(), project=project,
                               gpu_model="h100-80gb", profile="3g.40gb", minute=minute, seconds=60,
                               amount=Decimal(amount))


def test_spend_alerts_fire_at_50_and_80_percent_of_the_budget_once_each_and_start_over_next_month():
    user = UserFactory()
    project = Project.objects.create(user=user, name="training", monthly_budget=Decimal("100"))
    _usage(project, "49.99", T0)
    _usage(project, "20", T0 - timedelta(days=1))  # November's: not this month's spend
    alerts.alerts_evaluate(now=at(5))
    assert firing(user, "spend") == []
    _usage(project, "0.01", at(1))
    alerts.alerts_evaluate(now=at(6))
    [half] = firing(user, "spend")
    assert half.subject_key.endswith(":2026-12:50") and half.fired_at == at(6) and "$50.00 of $100.00" in half.detail
    alerts.alerts_evaluate(now=at(7))
    assert Alert.objects.filter(kind="spend").count() == 1
    _usage(project, "35", at(2))
    alerts.alerts_evaluate(now=at(8))
    [eighty] = firing(user, "spend")
    assert eighty.subject_key.endswith(":80") and eighty.severity == "warning"
    half.refresh_from_db()
    assert half.state == "resolved" and half.resolved_at == at(8)
    alerts.alerts_evaluate(now=datetime(2027, 1, 1, 0, 1, tzinfo=tz.utc))
    assert firing(user, "spend") == []


def test_the_spend_pass_reads_every_projects_spend_in_the_same_queries_however_many_projects():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries(n: int) -> int:
        Project.objects.filter(monthly_budget__isnull=False).update(monthly_budget=None)
        for _ in range(n):
            project = Project.objects.create(user=UserFactory(), name="p", monthly_budget=Decimal("100"))
            _usage(project, "10", T0)  # under every threshold: no alert to open
        with CaptureQueriesContext(connection) as ctx:
            alerts._spend(at(5))
        return len(ctx.captured_queries)

    assert queries(1) == queries(4)


def test_the_wallet_runway_alert_fires_under_24_hours_of_burn_and_resolves_after_a_top_up():
    fleet = Fleet()
    fleet.node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "5")
    orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True, gpu_models=["l4"]))
    fleet.play()
    alerts.alerts_evaluate()
    [alert] = firing(buyer, "wallet_runway")
    assert "runs out in about" in alert.title and "$1.80/h" in alert.detail
    top_up(buyer, "100")
    alerts.alerts_evaluate()
    assert firing(buyer, "wallet_runway") == []


def test_one_firing_alert_per_subject_and_a_fresh_one_after_it_resolves():
    user = UserFactory()
    first, opened = alert_fire(user=user, kind="other", subject_key="budget:cap:1", title="At the cap")
    again, opened_again = alert_fire(user=user, kind="other", subject_key="budget:cap:1", title="At the cap (2)")
    assert opened and not opened_again and again.pk == first.pk and again.title == "At the cap (2)"
    with pytest.raises(IntegrityError):
        Alert.objects.create(user=user, kind="other", subject_key="budget:cap:1", title="x", fired_at=T0)


def test_a_resolved_subject_fires_anew():
    user = UserFactory()
    first, _ = alert_fire(user=user, kind="other", subject_key="k", title="t")
    assert alert_resolve(user=user, subject_key="k").state == "resolved"
    assert alert_resolve(user=user, subject_key="k") is None
    second, opened = alert_fire(user=user, kind="other", subject_key="k", title="t")
    assert opened and second.pk != first.pk


@pytest.mark.parametrize("kind, params, why", [
    ("underused", {"util_below_percent": 0}, "util_below_percent"),
    ("underused", {"minutes": "15"}, "minutes"),
    ("spend", {"percents": []}, "percents"),
    ("wallet_runway", {"days": 2}, "no parameter"),
    ("nonsense", {}, "unknown alert kind"),
])
def test_bad_rule_parameters_are_refused_with_reasons(kind, params, why):
    with pytest.raises(DomainError, match=why):
        alerts.rule_create(user=UserFactory(), kind=kind, params=params)
    assert not AlertRule.objects.exists()


def test_one_rule_per_kind_and_reach():
    user = UserFactory()
    alerts.rule_create(user=user, kind="spend", params={"percents": [90]})
    with pytest.raises(Conflict):
        alerts.rule_create(user=user, kind="spend")


def test_a_firing_alert_is_mailed_once_and_posted_to_the_webhook_firing_and_resolved(
        lease, smtp, hook_url, django_capture_on_commit_callbacks):
    notifications.notification_settings_update(user=lease.buyer, webhook_url=hook_url)
    minutes(lease.slice.gpu_id, 0, 1, mem_gib=39)
    with django_capture_on_commit_callbacks(execute=True):
        alerts.alerts_evaluate(now=at(1))
    with django_capture_on_commit_callbacks(execute=True):
        alerts.alerts_evaluate(now=at(2))  # still firing: no second mail or POST
    message = smtp.wait_for("buyer@example.org", subject="close to running out of GPU memory")
    assert "7g.80gb" in body(message) and len(smtp.to("buyer@example.org")) == 1
    assert [p["type"] for _, p in Hook.received] == ["alert_firing"]
    assert Hook.received[0][1]["alert"]["kind"] == "oom_risk" and Hook.received[0][1]["alert"]["lease"] == str(lease.pk)
    minutes(lease.slice.gpu_id, 2, 2, mem_gib=1)
    with django_capture_on_commit_callbacks(execute=True):
        alerts.alerts_evaluate(now=at(3))
    assert [p["type"] for _, p in Hook.received] == ["alert_firing", "alert_resolved"]
    assert len(smtp.to("buyer@example.org")) == 1


def test_alerts_switched_off_on_the_account_post_nothing_and_a_rule_without_email_sends_none(
        lease, smtp, hook_url, django_capture_on_commit_callbacks):
    notifications.notification_settings_update(user=lease.buyer, webhook_url=hook_url, alerts=False)
    alerts.rule_create(user=lease.buyer, kind="oom_risk", email=False)
    minutes(lease.slice.gpu_id, 0, 0, mem_gib=39)
    with django_capture_on_commit_callbacks(execute=True):
        alerts.alerts_evaluate(now=at(1))
    assert len(firing(lease.buyer, "oom_risk")) == 1
    assert Hook.received == [] and smtp.to("buyer@example.org") == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_eight_firers_racing_on_one_subject_open_one_alert_and_announce_it_once(monkeypatch):
    from marketplace.lifecycle import alerts as alert_service

    user = UserFactory()
    announced, opened = [], []
    monkeypatch.setattr(alert_service, "_announce", lambda alert: announced.append(alert.pk))
    start = threading.Barrier(8)

    def fire():
        try:
            start.wait()
            opened.append(alert_fire(user=user, kind="other", subject_key="race", title="t", email=False)[1])
        finally:
            close_old_connections()

    threads = [threading.Thread(target=fire) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(opened) == [False] * 7 + [True]
    assert Alert.objects.filter(subject_key="race").count() == 1 and len(announced) == 1


def test_a_quiet_minute_costs_the_same_queries_for_two_leases_as_for_six():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fleet = Fleet()
    fleet.node("l4:8", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "10000")

    def lease_more(n):
        for _ in range(n):
            orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True, gpu_models=["l4"]))
        fleet.play()
        for lease in Lease.objects.filter(state=Lease.State.RUNNING):
            GpuMetricRollup.objects.get_or_create(gpu_id=lease.slice.gpu_id, minute=at(0), defaults={
                "samples": 60, "util_avg": 80.0, "util_max": 90.0, "mem_used_max": 1024.0})

    def cost():
        with CaptureQueriesContext(connection) as ctx:
            alerts.alerts_evaluate(now=at(1))
        return len(ctx.captured_queries)

    lease_more(2)
    two = cost()
    lease_more(4)
    assert Lease.objects.filter(state=Lease.State.RUNNING).count() == 6
    assert cost() == two and not Alert.objects.exists()
