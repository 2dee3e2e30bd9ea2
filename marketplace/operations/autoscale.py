"""Autoscaling rules (docs/operations.md, "Autoscaling"): a project's named workload group kept between a minimum
and a maximum of leases. The beat reads the group's minute rollups (and the queue length the workload reports),
decides (decide.autoscale_decide) and acts as the buyer would: a scale-out is an ordinary order through the
market (products.orders: the same validation, price, wallet check and scheduler), a scale-in ends the least
loaded lease through the lifecycle's one end transition. Every action, and every scale-out the market refused,
is logged with its reason."""
from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from marketplace import events
from marketplace.lifecycle.leases import lease_end
from marketplace.models import AutoscaleAction, AutoscaleRule, Lease, Mode, Order, Project, Template
from marketplace.products.orders import ORDER_BOUNDS, OrderSpec, order_place
from marketplace.products.workloads import WorkloadSpec
from scheduler.errors import Conflict, DomainError, NotFound
from scheduler.models import GpuModel

from .decide import ScaleRule, autoscale_decide
from .loads import lease_loads

END_REASON = "autoscale scale-in"
GROUP_STATES = (Lease.State.PROVISIONING, Lease.State.RUNNING, Lease.State.INTERRUPTING)
RULE_FIELDS = ("name", "enabled", "template", "mode", "gpu_models", "regions", "memory_gb", "compute_slices",
               "whole_gpu", "max_price_per_hour", "min_leases", "max_leases", "scale_out_pct", "scale_out_minutes",
               "scale_out_queue", "scale_in_pct", "scale_in_minutes", "scale_out_cooldown_seconds",
               "scale_in_cooldown_seconds")


# --- rules -------------------------------------------------------------------------------------------------------

def _check_rule(rule: AutoscaleRule) -> None:
    if rule.mode not in (Mode.ON_DEMAND, Mode.SPOT):
        raise DomainError("a group's leases are on_demand or spot", field="mode")
    if rule.mode == Mode.SPOT and not rule.max_price_per_hour:
        raise DomainError("a spot group needs a bid: max_price_per_hour > 0", field="max_price_per_hour")
    if not 1 <= rule.max_leases <= 50 or not 0 <= rule.min_leases <= rule.max_leases:
        raise DomainError("0 ≤ min_leases ≤ max_leases ≤ 50", field="min_leases")
    if not 0 <= rule.scale_in_pct < rule.scale_out_pct <= 100:
        raise DomainError("0 ≤ scale_in_pct < scale_out_pct ≤ 100 (a gap between them, or the group would "
                          "flap)", field="scale_in_pct")
    for name in ("scale_out_minutes", "scale_in_minutes"):
        if not 1 <= getattr(rule, name) <= 1440:
            raise DomainError(f"{name} is between 1 and 1440", field=name)
    for name in ("scale_out_cooldown_seconds", "scale_in_cooldown_seconds"):
        if not 0 <= getattr(rule, name) <= 86400:
            raise DomainError(f"{name} is between 0 and 86400", field=name)
    if rule.gpu_models:
        unknown = sorted(set(rule.gpu_models) - set(GpuModel.objects.filter(key__in=list(rule.gpu_models))
                                                    .values_list("key", flat=True)))
        if unknown:
            raise DomainError(f"unknown GPU model {unknown[0]!r}", field="gpu_models")
    low, high = ORDER_BOUNDS["memory_gb"]
    if not low <= rule.memory_gb <= high:
        raise DomainError(f"memory_gb is between {low} and {high}", field="memory_gb")


def autoscale_rule_save(*, user, project_id=None, rule_id=None, **fields) -> AutoscaleRule:
    """Create a rule on the user's project, or update `rule_id` of theirs; names are unique per project."""
    if rule_id is not None:
        rule = AutoscaleRule.objects.filter(pk=rule_id, project__user=user).first()
        if rule is None:
            raise NotFound("no such autoscaling rule among yours")
    else:
        project = Project.objects.filter(pk=project_id, user=user).first() if project_id not in (None, "") else None
        if project is None:
            raise NotFound("no such project among yours", field="project")
        rule = AutoscaleRule(project=project)
    if "template" in fields:  # a template's key ("" or None: no workload, the lease only holds its slice)
        key = fields.pop("template")
        rule.template = Template.objects.filter(key=key, enabled=True).first() if key else None
        if key and rule.template is None:
            raise DomainError(f"no template {key!r}; see GET /api/v1/templates/", field="template")
    for name, value in fields.items():
        if name in RULE_FIELDS:
            setattr(rule, name, value)
    _check_rule(rule)
    try:
        with transaction.atomic():
            rule.save()
    except IntegrityError:
        raise Conflict(f"the project has a rule named {rule.name!r} already", code="rule_exists",
                       field="name") from None
    return rule


def autoscale_rule_delete(*, user, rule_id) -> None:
    """Delete the rule; its leases keep running (end them, or lower min_leases to 0 first)."""
    deleted, _ = AutoscaleRule.objects.filter(pk=rule_id, project__user=user).delete()
    if not deleted:
        raise NotFound("no such autoscaling rule among yours")


def autoscale_queue_report(*, user, rule_id, length: int, now: datetime | None = None) -> AutoscaleRule:
    """The workload's queue length now (a scale-out signal while it is fresh: the scale-out window)."""
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= 10 ** 9:
        raise DomainError("length is a whole number ≥ 0", field="length")
    now = now or timezone.now()
    changed = AutoscaleRule.objects.filter(pk=rule_id, project__user=user).update(queue_length=length,
                                                                                  queue_reported_at=now)
    if not changed:
        raise NotFound("no such autoscaling rule among yours")
    return AutoscaleRule.objects.get(pk=rule_id)


def group_leases(rule: AutoscaleRule):
    """The group's open leases: those of the orders its scale-outs placed (not those already ending)."""
    return Lease.objects.filter(order__autoscale_actions__rule=rule,
                                order__autoscale_actions__kind=AutoscaleAction.Kind.SCALE_OUT,
                                state__in=GROUP_STATES).distinct()


def group_lease_ids(*, user) -> dict[int, list[str]]:
    """Each of the user's rules' open leases, in one query: {rule id: [lease id, ...]}."""
    out: dict[int, list[str]] = {}
    rows = (AutoscaleAction.objects.filter(rule__project__user=user, kind=AutoscaleAction.Kind.SCALE_OUT,
                                           order__leases__state__in=GROUP_STATES)
            .values_list("rule_id", "order__leases__id").order_by("at"))
    for rule_id, lease_id in rows:
        out.setdefault(rule_id, []).append(str(lease_id))
    return out


# --- the beat ----------------------------------------------------------------------------------------------------

def _scale_rule(rule: AutoscaleRule) -> ScaleRule:
    return ScaleRule(min_leases=rule.min_leases, max_leases=rule.max_leases, scale_out_pct=rule.scale_out_pct,
                     scale_out_minutes=rule.scale_out_minutes, scale_in_pct=rule.scale_in_pct,
                     scale_in_minutes=rule.scale_in_minutes, scale_out_queue=rule.scale_out_queue,
                     scale_out_cooldown_seconds=rule.scale_out_cooldown_seconds,
                     scale_in_cooldown_seconds=rule.scale_in_cooldown_seconds)


def autoscale_tick(*, now: datetime | None = None) -> int:
    """Beat: each enabled rule decides and acts once. Returns how many actions were taken (refusals included)."""
    now = now or timezone.now()
    acted = 0
    for rule_id in list(AutoscaleRule.objects.filter(enabled=True).values_list("id", flat=True)):
        acted += autoscale_rule_evaluate(rule_id=rule_id, now=now)
    return acted


def autoscale_rule_evaluate(*, rule_id, now: datetime) -> int:
    """One rule's decision and action, under the rule's lock (two beats never both scale it). 1 if it acted."""
    with transaction.atomic():
        # Lock the rule: the race is two beats (or workers) scaling the same group at once.
        rule = AutoscaleRule.objects.select_for_update(of=("self",)).select_related("project", "template").filter(
            pk=rule_id, enabled=True).first()
        if rule is None:
            return 0
        leases = list(group_leases(rule).select_related("slice__gpu"))
        running = [lease for lease in leases if lease.state == Lease.State.RUNNING]
        minutes = max(rule.scale_out_minutes, rule.scale_in_minutes)
        loads = lease_loads(leases=running, now=now, minutes=minutes)
        step = autoscale_decide(rule=_scale_rule(rule), members=list(loads.values()), count=len(leases), now=now,
                                last_action_at=rule.last_action_at, queue_length=rule.queue_length,
                                queue_reported_at=rule.queue_reported_at)
        if step.action == "scale_out":
            _scale_out(rule, step, count=len(leases), now=now)
        elif step.action == "scale_in" and step.lease:
            _scale_in(rule, step, count=len(leases), now=now)
        else:
            return 0
        rule.last_action_at = now
        rule.save(update_fields=["last_action_at"])
        events.tell_buyer(rule.project.user_id, {"type": "autoscale", "rule": rule.pk, "action": step.action,
                                                 "reason": step.reason})
    return 1


def _spec(rule: AutoscaleRule) -> OrderSpec:
    return OrderSpec(mode=rule.mode, gpu_models=list(rule.gpu_models), memory_gb=rule.memory_gb,
                     compute_slices=rule.compute_slices, whole_gpu=rule.whole_gpu or None,
                     regions=list(rule.regions), max_price_per_hour=rule.max_price_per_hour,
                     project_id=rule.project_id, if_unavailable=Order.IfUnavailable.FAIL,
                     workload=WorkloadSpec(template=rule.template.key) if rule.template_id else None)


def _scale_out(rule: AutoscaleRule, step, *, count: int, now: datetime) -> None:
    """An ordinary order for one more lease; a refusal (no capacity, no money, a bid too low) is logged instead."""
    try:
        with transaction.atomic():
            order = order_place(buyer=rule.project.user, spec=_spec(rule), now=now)
            AutoscaleAction.objects.create(rule=rule, at=now, kind=AutoscaleAction.Kind.SCALE_OUT, order=order,
                                           leases_before=count, util_pct=step.util, reason=step.reason[:300])
    except DomainError as exc:
        AutoscaleAction.objects.create(rule=rule, at=now, kind=AutoscaleAction.Kind.REFUSED, leases_before=count,
                                       util_pct=step.util,
                                       reason=f"{step.reason}; the market refused the order: {exc.message}"[:300])


def _scale_in(rule: AutoscaleRule, step, *, count: int, now: datetime) -> None:
    lease = lease_end(lease_id=step.lease, reason=END_REASON, at=now)
    AutoscaleAction.objects.create(rule=rule, at=now, kind=AutoscaleAction.Kind.SCALE_IN, lease=lease,
                                   order_id=lease.order_id, leases_before=count, util_pct=step.util,
                                   reason=step.reason[:300])
