"""Alert pages: the user's alerts (the bell's list) and their rules (docs/operations.md "Alerts")."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from marketplace.models import Alert, AlertKind, AlertRule, Project
from marketplace.products import alerts
from scheduler.errors import DomainError

from ..forms import AlertRuleForm
from .common import add_domain_error, mark_invalid

LIST_LIMIT = 100


@login_required
def alert_list(request):
    state = request.GET.get("state") if request.GET.get("state") in Alert.State.values else None
    rows = list(alerts.alert_list(user=request.user, state=state).select_related("lease", "project")[:LIST_LIMIT])
    return render(request, "console/alerts.html", {
        "nav": "alerts", "alerts": rows, "state": state, "limit": LIST_LIMIT,
        "firing": [a for a in rows if a.state == Alert.State.FIRING],
        "resolved": [a for a in rows if a.state == Alert.State.RESOLVED]})


def _form_of(row: dict, data=None) -> AlertRuleForm:
    rule, params = row["rule"], row["params"]
    initial = {"enabled": rule.enabled if rule else True, "email": rule.email if rule else True, **params}
    if "percents" in params:
        initial["percents"] = ", ".join(map(str, params["percents"]))
    return AlertRuleForm(data, prefix=row["kind"], initial=initial)


def _rules_page(request, *, bad: tuple[str, AlertRuleForm] | None = None, status: int = 200):
    rows = alerts.rules_effective(user=request.user)
    for row in rows:
        row["form"] = bad[1] if bad and bad[0] == row["kind"] else _form_of(row)
        row["fields"] = [row["form"][name] for name in AlertRuleForm.PARAMS[row["kind"]]]
    narrower = (AlertRule.objects.filter(user=request.user).exclude(project=None, lease=None)
                .select_related("project", "lease").order_by("kind", "id"))
    project_form = bad[1] if bad and bad[0] == "project" else AlertRuleForm(prefix="project", initial={
        "enabled": True, "email": True})
    return render(request, "console/alert_rules.html", {
        "nav": "alerts", "rows": rows, "narrower": narrower, "project_form": project_form,
        "project_kinds": [(k, AlertKind(k).label) for k in (AlertKind.SPEND, AlertKind.UNDERUSED, AlertKind.OOM_RISK)],
        "projects": Project.objects.filter(user=request.user).order_by("name")}, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def alert_rules(request):
    if request.method == "GET":
        return _rules_page(request)
    kind = request.POST.get("kind", "")
    if kind not in alerts.RULE_KINDS:
        raise Http404("no such kind of alert")
    project_id = request.POST.get("project") or None
    form = AlertRuleForm(request.POST, prefix="project" if project_id else kind)
    if form.is_valid():
        try:
            alerts.rule_set(user=request.user, kind=kind, params=form.params_for(kind), project_id=project_id,
                            enabled=form.cleaned_data["enabled"], email=form.cleaned_data["email"])
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            where = "" if project_id is None else " for the project"
            messages.success(request, f"{AlertKind(kind).label.capitalize()} rule saved{where}.")
            return redirect("console:alert-rules")
    mark_invalid(form)
    return _rules_page(request, bad=("project" if project_id else kind, form), status=400)


@login_required
@require_POST
def alert_rule_delete(request, rule_id):
    rule = AlertRule.objects.filter(pk=rule_id, user=request.user).first()
    if rule is None:
        raise Http404("no such rule")
    alerts.rule_delete(rule=rule)
    messages.success(request, "Rule removed: the account's rule (or the default) applies there again.")
    return redirect("console:alert-rules")
