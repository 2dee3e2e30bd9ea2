"""The Operations page: idle reclaim policies and their log (what was reclaimed and saved), autoscaling rules and
their action log. Thin: the forms' input goes to the services in marketplace/operations."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Sum
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from marketplace.models import AutoscaleAction, AutoscaleRule, Project, ReclaimNotice, ReclaimPolicy
from marketplace.operations import autoscale, reclaim
from scheduler.errors import DomainError

from ..operations_forms import AutoscaleRuleForm, ReclaimPolicyForm
from .common import Confirm, add_domain_error, confirm_page, mark_invalid


def _projects(user):
    return list(Project.objects.filter(user=user).order_by("name"))


def _page(request, *, policy_form=None, rule_form=None, editing=None, status=200):
    user = request.user
    projects = _projects(user)
    notices = ReclaimNotice.objects.filter(policy__user=user).select_related("policy__project").order_by(
        "-noticed_at")
    rules = list(AutoscaleRule.objects.filter(project__user=user).select_related("project", "template"))
    group = autoscale.group_lease_ids(user=user)
    for rule in rules:
        rule.open_leases = group.get(rule.pk, [])
    return render(request, "console/operations.html", {
        "nav": "operations", "projects": projects,
        "policies": ReclaimPolicy.objects.filter(user=user).select_related("project").order_by("project__name"),
        "policy_form": policy_form or ReclaimPolicyForm(prefix="policy", projects=projects),
        "notices": notices[:50],
        "saved_total": notices.filter(state=ReclaimNotice.State.RECLAIMED).aggregate(s=Sum("saved"))["s"] or 0,
        "rules": rules, "editing": editing,
        "rule_form": rule_form or AutoscaleRuleForm(prefix="rule", projects=projects),
        "actions": AutoscaleAction.objects.filter(rule__project__user=user).select_related("rule")[:50],
    }, status=status)


@login_required
def operations(request):
    return _page(request)


@login_required
@require_POST
def reclaim_policy_save(request):
    """Save the policy of the chosen scope (the default, or a project): a new one, or the existing one changed. The
    form is the scope's settings, so it edits what is there (and says so) where the API's POST, which creates,
    answers 409 and leaves edits to PATCH."""
    form = ReclaimPolicyForm(request.POST, prefix="policy", projects=_projects(request.user))
    if form.is_valid():
        data = dict(form.cleaned_data)
        project_id = data.pop("project")
        existing = ReclaimPolicy.objects.filter(user=request.user, project_id=project_id).first()
        try:
            reclaim.reclaim_policy_save(user=request.user, project_id=project_id,
                                        policy_id=existing.pk if existing else None, **data)
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            scope = f"project {existing.project.name}" if existing and existing.project else "your account's default"
            messages.success(request, f"Idle reclaim policy for {scope} updated." if existing else
                             "Idle reclaim policy saved.")
            return redirect(reverse("console:operations") + "#reclaim")
    mark_invalid(form)
    return _page(request, policy_form=form, status=400)


def _delete(request, found, confirm: Confirm, act, said: str, anchor: str):
    """A delete with its confirmation: GET asks (changing nothing), POST does it; someone else's is missing."""
    if found is None:
        messages.error(request, "Nothing like that among yours.")
        return redirect("console:operations")
    if request.method == "GET":
        return confirm_page(request, confirm)
    act()
    messages.success(request, said)
    return redirect(reverse("console:operations") + anchor)


@login_required
@require_http_methods(["GET", "POST"])
def reclaim_policy_delete(request, policy_id):
    policy = ReclaimPolicy.objects.filter(pk=policy_id, user=request.user).first()
    return _delete(request, policy, Confirm(
        title="Delete this idle reclaim policy?",
        points=["Idle leases it covers are no longer ended; notices it gave are withdrawn.",
                "Its log of what was reclaimed and saved goes with it."],
        action="Delete policy", keep="Keep it", back=reverse("console:operations") + "#reclaim"),
        lambda: reclaim.reclaim_policy_delete(user=request.user, policy_id=policy_id),
        "Idle reclaim policy deleted.", "#reclaim")


def _rule_initial(rule: AutoscaleRule) -> dict:
    return {"project": rule.project_id, "name": rule.name, "template": rule.template.key if rule.template_id else "",
            "mode": rule.mode, "gpu_model": (rule.gpu_models or [""])[0], "whole_gpu": rule.whole_gpu,
            "memory_gb": rule.memory_gb, "region": (rule.regions or [""])[0],
            "max_price_per_hour": rule.max_price_per_hour, "min_leases": rule.min_leases,
            "max_leases": rule.max_leases, "scale_out_pct": rule.scale_out_pct,
            "scale_out_minutes": rule.scale_out_minutes, "scale_out_queue": rule.scale_out_queue,
            "scale_in_pct": rule.scale_in_pct, "scale_in_minutes": rule.scale_in_minutes,
            "scale_out_cooldown_seconds": rule.scale_out_cooldown_seconds,
            "scale_in_cooldown_seconds": rule.scale_in_cooldown_seconds, "enabled": rule.enabled}


@login_required
@require_http_methods(["GET", "POST"])
def autoscale_rule(request, rule_id=None):
    """GET with a rule: its form, filled in; POST: create (no rule) or save it."""
    rule = None
    if rule_id is not None:
        rule = AutoscaleRule.objects.filter(pk=rule_id, project__user=request.user).first()
        if rule is None:
            messages.error(request, "No such autoscaling rule among yours.")
            return redirect("console:operations")
    projects = _projects(request.user)
    if request.method == "GET":
        form = AutoscaleRuleForm(prefix="rule", projects=projects, initial=_rule_initial(rule) if rule else None)
        return _page(request, rule_form=form, editing=rule)
    form = AutoscaleRuleForm(request.POST, prefix="rule", projects=projects)
    if form.is_valid():
        try:
            saved = autoscale.autoscale_rule_save(user=request.user, project_id=form.cleaned_data["project"],
                                                  rule_id=rule.pk if rule else None, **form.rule_fields())
        except DomainError as exc:
            add_domain_error(form, exc, fields={"gpu_models": "gpu_model", "regions": "region"})
        else:
            messages.success(request, f"Autoscaling rule “{saved.name}” saved.")
            return redirect(reverse("console:operations") + "#autoscaling")
    mark_invalid(form)
    return _page(request, rule_form=form, editing=rule, status=400)


@login_required
@require_http_methods(["GET", "POST"])
def autoscale_rule_delete(request, rule_id):
    rule = AutoscaleRule.objects.filter(pk=rule_id, project__user=request.user).first()
    return _delete(request, rule, Confirm(
        title=f"Delete the autoscaling rule “{rule.name if rule else ''}”?",
        points=["Its leases keep running (and billing) until you end them: set its minimum to 0 and let it "
                "scale in first if you want them gone.", "Its action log goes with it."],
        action="Delete rule", keep="Keep it", back=reverse("console:operations") + "#autoscaling"),
        lambda: autoscale.autoscale_rule_delete(user=request.user, rule_id=rule_id),
        f"Autoscaling rule “{rule.name if rule else ''}” deleted.", "#autoscaling")
