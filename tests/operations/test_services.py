"""Idle reclaim and autoscaling on the database with simulated agents (tests/marketplace/marketsim.py): the beat's
ticks at chosen instants over rollups the test writes; the money compared with the lease's seconds × price."""
from __future__ import annotations

from datetime import time, timedelta
from decimal import Decimal

import pytest
from django.core import mail

from marketplace.amounts import cost
from marketplace.models import Alert, Lease, Order, Project, ReclaimNotice
from marketplace.operations import autoscale, reclaim
from marketplace.products import orders
from marketplace.products.orders import OrderSpec
from scheduler.errors import Conflict, DomainError
from scheduler.models import GpuMetricRollup
from tests.factories import UserFactory
from tests.marketplace.marketsim import top_up, wallet

pytestmark = pytest.mark.django_db
M = timedelta(minutes=1)


def minute_of(t):
    return t.replace(second=0, microsecond=0)


def rollups(lease: Lease, start, end, util: float) -> None:
    """Minute rollups of `lease`'s GPU at `util` for every minute in [start, end)."""
    m = minute_of(start)
    while m < end:
        GpuMetricRollup.objects.update_or_create(gpu_id=lease.slice.gpu_id, minute=m, defaults={
            "samples": 60, "util_min": util, "util_avg": util, "util_max": util})
        m += M


def billed(lease: Lease) -> Decimal:
    """What the lease should have cost, by docs/market.md's rule: its price per hour for every whole second from its
    start (truncated to the second) to its end."""
    seconds = int((lease.ended_at - lease.started_at.replace(microsecond=0)).total_seconds())
    return cost(per_hour=lease.price_per_hour, seconds=seconds)


def running(fleet, buyer, **spec) -> Lease:
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", **spec))
    fleet.play()
    lease = Lease.objects.get(order=order)
    assert lease.state == Lease.State.RUNNING
    return lease


# --- idle reclaim ------------------------------------------------------------------------------------------------

def test_an_idle_lease_gets_a_notice_by_mail_then_is_reclaimed_and_the_saving_is_its_remaining_time_at_its_price(
        fleet, django_capture_on_commit_callbacks):
    fleet.node("l4:1", price="3.60")
    buyer = UserFactory(email="lead@example.com")
    top_up(buyer, "100")
    lease = running(fleet, buyer, gpu_models=["l4"], duration_seconds=4 * 3600)
    policy = reclaim.reclaim_policy_save(user=buyer, idle_below_pct=10, idle_minutes=15, hours_start=time(0),
                                         hours_end=time(0), grace_minutes=10)
    t = minute_of(lease.started_at) + 17 * M
    rollups(lease, lease.started_at, t + 20 * M, 4.0)
    with django_capture_on_commit_callbacks(execute=True):
        assert reclaim.reclaim_tick(now=t) == 0
    notice = ReclaimNotice.objects.get(lease=lease)
    [alert] = Alert.objects.filter(user=buyer, state="firing")  # the bell says it too, until it is reclaimed
    assert alert.lease_id == lease.pk and "will be ended at" in alert.title
    assert notice.state == "pending" and notice.act_at == t + 10 * M and notice.util_pct == 4.0
    assert len(mail.outbox) == 1 and "will be ended at" in mail.outbox[0].subject
    assert reclaim.reclaim_tick(now=t + 10 * M - timedelta(seconds=1)) == 0  # the grace is not over
    assert reclaim.reclaim_tick(now=t + 10 * M) == 1
    fleet.play()
    lease.refresh_from_db()
    notice.refresh_from_db()
    assert lease.state == Lease.State.ENDED and lease.end_reason == "idle reclaim"
    assert lease.ended_at == t + 10 * M
    # Saved: the rest of its 4 hours at its price, avoided; charged: the seconds it ran at its price.
    assert notice.state == "reclaimed" and notice.saved_until == lease.started_at + timedelta(hours=4)
    rest = (lease.started_at + timedelta(hours=4) - (t + 10 * M)).total_seconds()
    assert notice.saved == cost(per_hour=lease.price_per_hour, seconds=rest)
    assert lease.cost_charged == billed(lease)
    assert wallet(buyer) == Decimal("100") - lease.cost_charged
    assert policy.notices.count() == 1
    alert.refresh_from_db()
    assert alert.state == "resolved" and alert.resolved_at == t + 10 * M


def test_a_notice_is_cancelled_when_the_lease_gets_busy_within_the_grace_and_it_keeps_running(fleet):
    fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = running(fleet, buyer, gpu_models=["l4"])
    reclaim.reclaim_policy_save(user=buyer, idle_below_pct=10, idle_minutes=5, hours_start=time(0),
                                hours_end=time(0), grace_minutes=10)
    t = minute_of(lease.started_at) + 7 * M
    rollups(lease, lease.started_at, t, 2.0)
    reclaim.reclaim_tick(now=t)
    rollups(lease, t, t + 3 * M, 80.0)
    assert reclaim.reclaim_tick(now=t + 3 * M) == 0
    notice = ReclaimNotice.objects.get(lease=lease)
    assert notice.state == "cancelled" and notice.reason.startswith("busy again (80%")
    assert Alert.objects.get(user=buyer, subject_key=f"reclaim:{lease.pk}").state == "resolved"
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING


def test_outside_the_reclaim_hours_an_idle_lease_is_left_alone(fleet):
    fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = running(fleet, buyer, gpu_models=["l4"])
    t = minute_of(lease.started_at) + 7 * M
    start = (t + 60 * M).time()  # the hours start in an hour (UTC)
    reclaim.reclaim_policy_save(user=buyer, idle_below_pct=10, idle_minutes=5, hours_start=start,
                                hours_end=(t + 120 * M).time(), grace_minutes=0)
    rollups(lease, lease.started_at, t, 2.0)
    reclaim.reclaim_tick(now=t)
    assert not ReclaimNotice.objects.exists()


def test_a_projects_own_policy_wins_over_the_buyers_default(fleet):
    fleet.node("l4:2")
    buyer = UserFactory()
    top_up(buyer, "100")
    project = Project.objects.create(user=buyer, name="night-training")
    plain = running(fleet, buyer, gpu_models=["l4"])
    in_project = running(fleet, buyer, gpu_models=["l4"], project_id=project.pk)
    reclaim.reclaim_policy_save(user=buyer, idle_below_pct=10, idle_minutes=5, hours_start=time(0),
                                hours_end=time(0))
    reclaim.reclaim_policy_save(user=buyer, project_id=project.pk, idle_below_pct=1, idle_minutes=5,
                                hours_start=time(0), hours_end=time(0))
    t = minute_of(max(plain.started_at, in_project.started_at)) + 7 * M
    for lease in (plain, in_project):
        rollups(lease, lease.started_at - 2 * M, t, 5.0)  # idle for the default (10%), not for the project (1%)
    reclaim.reclaim_tick(now=t)
    assert list(ReclaimNotice.objects.values_list("lease_id", flat=True)) == [plain.pk]
    with pytest.raises(Conflict):
        reclaim.reclaim_policy_save(user=buyer, idle_below_pct=10, idle_minutes=5, hours_start=time(0),
                                    hours_end=time(0))


@pytest.mark.parametrize("field,value", [("idle_below_pct", 0), ("idle_minutes", 0), ("timezone", "Mars/Olympus"),
                                         ("grace_minutes", 2000)])
def test_a_policy_out_of_bounds_is_refused_naming_the_field(field, value):
    fields = {"idle_below_pct": 10, "idle_minutes": 5, "hours_start": time(22), "hours_end": time(6)} | {field: value}
    with pytest.raises(DomainError) as err:
        reclaim.reclaim_policy_save(user=UserFactory(), **fields)
    assert err.value.field == field


# --- autoscaling -------------------------------------------------------------------------------------------------

def rule_for(buyer, **kw):
    project = Project.objects.create(user=buyer, name="inference")
    fields = {"name": "web", "gpu_models": ["l4"], "whole_gpu": True, "min_leases": 1, "max_leases": 3,
              "scale_out_pct": 70, "scale_out_minutes": 2, "scale_in_pct": 20, "scale_in_minutes": 3,
              "scale_out_cooldown_seconds": 600, "scale_in_cooldown_seconds": 120} | kw
    return autoscale.autoscale_rule_save(user=buyer, project_id=project.pk, **fields)


def test_a_rule_keeps_its_minimum_scales_out_when_busy_respects_its_cooldown_and_scales_in_when_idle(fleet):
    fleet.node("l4:3", price="3.60")
    buyer = UserFactory()
    top_up(buyer, "100")
    rule = rule_for(buyer)
    assert autoscale.autoscale_tick() == 1  # the minimum: an ordinary order, placed by the market
    fleet.play()
    first = autoscale.group_leases(rule).get()
    assert first.state == Lease.State.RUNNING and first.order.project_id == rule.project_id
    assert first.order.mode == "on_demand" and first.order.state == Order.State.PLACED
    t = minute_of(first.started_at) + 12 * M  # past the first action's cooldown
    rollups(first, first.started_at - M, t, 90.0)
    assert autoscale.autoscale_tick(now=t) == 1
    fleet.play()
    members = list(autoscale.group_leases(rule).order_by("created_at"))
    assert len(members) == 2 and all(x.state == Lease.State.RUNNING for x in members)
    out = rule.actions.filter(kind="scale_out").latest("at")
    assert out.leases_before == 1 and out.util_pct == 90.0 and "above 70% for 2 min" in out.reason
    # Busy still, but within the scale-out cooldown: nothing, and the log says so only through the absence.
    rollups(members[1], t - 5 * M, t + 9 * M, 90.0)
    rollups(first, t, t + 9 * M, 90.0)
    assert autoscale.autoscale_tick(now=t + 9 * M) == 0
    assert autoscale.group_leases(rule).count() == 2
    # Idle for the scale-in window, past the cooldowns: the least loaded (the newest among equals) ends.
    second = members[1]
    later = t + 12 * M
    rollups(first, later - 3 * M, later, 10.0)
    rollups(second, later - 3 * M, later, 10.0)
    assert autoscale.autoscale_tick(now=later) == 1
    fleet.play()
    second.refresh_from_db()
    assert second.state == Lease.State.ENDED and second.end_reason == "autoscale scale-in"
    assert autoscale.group_leases(rule).get().pk == first.pk
    scale_in = rule.actions.get(kind="scale_in")
    assert scale_in.lease_id == second.pk and "below 20% for 3 min" in scale_in.reason
    # The money: each lease's seconds at its price, and the wallet paid exactly that.
    assert second.cost_charged == billed(second)
    assert wallet(buyer) == Decimal("100") - second.cost_charged - Lease.objects.get(pk=first.pk).cost_charged


def test_a_scale_out_the_market_refuses_is_logged_with_its_reason_and_waits_for_the_cooldown(fleet):
    fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    rule = rule_for(buyer, gpu_models=["h100-80gb"], min_leases=1)
    assert autoscale.autoscale_tick() == 1
    refused = rule.actions.get()
    assert refused.kind == "refused" and "the market refused the order" in refused.reason
    assert not Order.objects.filter(buyer=buyer).exists()
    assert autoscale.autoscale_tick() == 0  # the cooldown after the refusal


def test_a_reported_queue_scales_the_group_out(fleet):
    fleet.node("l4:2")
    buyer = UserFactory()
    top_up(buyer, "100")
    rule = rule_for(buyer, scale_out_queue=5, scale_out_cooldown_seconds=0)
    autoscale.autoscale_tick()
    fleet.play()
    autoscale.autoscale_queue_report(user=buyer, rule_id=rule.pk, length=7)
    assert autoscale.autoscale_tick() == 1
    assert "queue is 7" in rule.actions.latest("at").reason
    with pytest.raises(DomainError):
        autoscale.autoscale_queue_report(user=buyer, rule_id=rule.pk, length=-1)


@pytest.mark.parametrize("field,value", [("scale_in_pct", 80), ("min_leases", 5), ("gpu_models", ["nope"]),
                                         ("mode", "reserved")])
def test_a_rule_out_of_bounds_is_refused_naming_the_field(field, value):
    buyer = UserFactory()
    with pytest.raises(DomainError) as err:
        rule_for(buyer, **{field: value})
    assert err.value.field == field


def test_an_autoscaled_lease_is_not_reclaimed_its_rule_ends_it(fleet):
    fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    rule = rule_for(buyer)
    autoscale.autoscale_tick()
    fleet.play()
    lease = autoscale.group_leases(rule).get()
    reclaim.reclaim_policy_save(user=buyer, idle_below_pct=10, idle_minutes=5, hours_start=time(0),
                                hours_end=time(0))
    t = minute_of(lease.started_at) + 7 * M
    rollups(lease, lease.started_at - M, t, 1.0)
    reclaim.reclaim_tick(now=t)
    assert not ReclaimNotice.objects.exists()


def test_a_mig_slices_utilisation_is_its_gpus_divided_by_its_compute_share(fleet):
    from marketplace.operations.loads import compute_share, lease_loads

    fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    lease = running(fleet, buyer, gpu_models=["a100-80gb"], memory_gb=10)  # 1g.10gb: 1 of 7 compute slices
    assert lease.slice.profile == "1g.10gb" and compute_share(lease) == pytest.approx(1 / 7)
    t = minute_of(lease.started_at) + 3 * M
    rollups(lease, t - 2 * M, t - M, 10.0)
    rollups(lease, t - M, t, 50.0)
    util = lease_loads(leases=[lease], now=t, minutes=2)[str(lease.pk)].util
    assert util == {t - 2 * M: pytest.approx(70.0), t - M: 100.0}  # capped: no slice is busier than all of it


def test_inside_the_reclaim_hours_queued_job_orders_wait_for_their_end(fleet):
    from marketplace.lifecycle.leases import lease_end
    from marketplace.products.workloads import WorkloadSpec

    fleet.node("l4:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    blocker = running(fleet, buyer, gpu_models=["l4"])
    now = blocker.started_at
    start, end = (now - 30 * M).time(), (now + 90 * M).time()  # UTC hours that hold `now`
    policy = reclaim.reclaim_policy_save(user=buyer, idle_below_pct=1, idle_minutes=60, hours_start=start,
                                         hours_end=end)
    job = orders.order_place(buyer=buyer, now=now, spec=OrderSpec(
        mode="on_demand", gpu_models=["l4"], if_unavailable="queue",
        workload=WorkloadSpec(image="docker.io/library/ubuntu:24.04", kind="job")))
    assert job.state == Order.State.QUEUED
    reclaim.reclaim_tick(now=now)
    policy.refresh_from_db()
    ends = now + 90 * M
    assert policy.holding_until == ends
    lease_end(lease_id=blocker.pk, at=now + M)
    fleet.play()
    assert orders.orders_retry(now=now + 2 * M) == 0  # free, but held: it is a job, inside the hours
    job.refresh_from_db()
    assert job.state == Order.State.QUEUED
    assert orders.orders_retry(now=ends) == 1  # the hours are over
    job.refresh_from_db()
    assert job.state == Order.State.PLACED
