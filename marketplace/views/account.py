"""Account pages: API keys (created, shown once, revoked), SSH keys, projects, notification settings, the password
and the optional second factor (TOTP)."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from base64 import b32encode

import segno

from django.utils import timezone

from marketplace import notifications
from marketplace.lifecycle import budgets
from marketplace.models import ApiKey, Project, ProviderProfile, SshKey
from marketplace.amounts import usd
from marketplace.conf import market
from marketplace.products import apikeys, projects, workloads
from marketplace.products.accounts import totp
from scheduler.errors import DomainError

from ..account_forms import CodeForm
from ..forms import ApiKeyForm, NotificationSettingsForm, ProjectBudgetForm, ProjectForm, SshKeyForm
from .common import Confirm, add_domain_error, confirm_page, mark_invalid


def _notification_form(user) -> NotificationSettingsForm:
    row = notifications.notification_settings_for(user=user)
    return NotificationSettingsForm(prefix="notify", initial={
        "webhook_url": row.webhook_url, **{kind: getattr(row, kind) for kind in row.KINDS}})


def _two_factor(user, form=None, recovery_codes=None) -> dict:
    """The second factor's section: on or off, the key being set up (QR code, otpauth:// URI, the key to type)."""
    pending = None if totp.totp_enabled(user) else totp.totp_pending(user)
    setup = None
    if pending is not None:
        uri = pending.config_url
        key = b32encode(pending.bin_key).decode()
        setup = {"uri": uri, "qr": segno.make(uri, error="m").svg_data_uri(scale=4, border=2),
                 "key": " ".join(key[i:i + 4] for i in range(0, len(key), 4))}
    return {"totp_on": pending is None and totp.totp_enabled(user), "totp_setup": setup,
            "recovery_left": totp.recovery_codes_left(user), "recovery_codes": recovery_codes,
            "totp_form": form or CodeForm(prefix="totp")}


def _page(request, *, key_form=None, project_form=None, notification_form=None, ssh_form=None, secret=None,
          new_key=None, totp_form=None, recovery_codes=None, status=200):
    return render(request, "console/account.html", {
        **_two_factor(request.user, totp_form, recovery_codes),
        "provider_profile": ProviderProfile.of(request.user),
        "ssh_keys": SshKey.objects.filter(user=request.user), "ssh_form": ssh_form or SshKeyForm(prefix="ssh"),
        "notification_form": notification_form or _notification_form(request.user),
        "keys": ApiKey.objects.filter(user=request.user).order_by("-created_at"),
        "projects": Project.objects.filter(user=request.user).order_by("name"),
        "key_form": key_form or ApiKeyForm(default_scopes=apikeys.default_scopes(user=request.user)),
        "project_form": project_form or ProjectForm(prefix="project"),
        "secret": secret, "new_key": new_key, "nav": "account"}, status=status)


def _submit(request, form, slot: str, act, said, *, to: str = "console:account"):
    """One posted account form: valid input goes to the service (`act`), then a message (`said` of what it
    returned) and a redirect; invalid input or a refusal shows the page again with the form's errors (400)."""
    if form.is_valid():
        try:
            done = act(form.cleaned_data)
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, said(done))
            return redirect(to)
    mark_invalid(form)
    return _page(request, **{slot: form}, status=400)


@login_required
def account(request):
    return _page(request)


@login_required
@require_POST
def api_key_create(request):
    form = ApiKeyForm(request.POST)
    if form.is_valid():
        try:
            key, secret = apikeys.api_key_create(user=request.user, name=form.cleaned_data["name"],
                                                 scopes=form.cleaned_data["scopes"])
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            # The secret is in this response only: never stored, never in a redirect or a message.
            return _page(request, secret=secret, new_key=key)
    mark_invalid(form)
    return _page(request, key_form=form, status=400)


@login_required
@require_http_methods(["GET", "POST"])
def api_key_revoke(request, key_id):
    key = ApiKey.objects.filter(pk=key_id, user=request.user).first()
    if key is None:
        messages.error(request, "No such API key among yours.")
        return redirect("console:account")
    if request.method == "GET":
        made = key.children.filter(revoked_at__isnull=True).count()
        return confirm_page(request, Confirm(
            title=f"Revoke the API key “{key.name}”?",
            points=[f"Requests with {key.prefix}… are refused from now on: scripts and tools using it stop working.",
                    f"The {made} key{'s' if made > 1 else ''} made with it are revoked too." if made else "",
                    "A revoked key cannot be turned back on: create a new key instead."],
            action="Revoke key", keep="Keep it", back=reverse("console:account") + "#api-keys",
            refused="This key is revoked already." if key.revoked_at else ""))
    key = apikeys.api_key_revoke(user=request.user, key_id=key.pk)
    messages.success(request, f"API key “{key.name}” is revoked, with the keys made with it: requests with them "
                              f"are refused from now on.")
    return redirect("console:account")


@login_required
@require_POST
def project_create(request):
    return _submit(request, ProjectForm(request.POST, prefix="project"), "project_form",
                   lambda data: projects.project_create(user=request.user, **data),
                   lambda project: f"Project “{project.name}” created.")


def _own_project(request, project_id) -> Project | None:
    """The signed-in buyer's project, or None with a message saying so (another's is not found either)."""
    project = Project.objects.filter(pk=project_id, user=request.user).first()
    if project is None:
        messages.error(request, "No such project among yours.")
    return project


@login_required
@require_http_methods(["GET", "POST"])
def project_delete(request, project_id):
    project = _own_project(request, project_id)
    if project is None:
        return redirect("console:account")
    if request.method == "GET":
        return confirm_page(request, Confirm(
            title=f"Delete the project “{project.name}”?",
            points=["It leaves your projects and the order form; nothing was billed to it, so no statement changes.",
                    "A project with usage or charges on record is kept (rename it instead)."],
            action="Delete project", keep="Keep it", back=reverse("console:account") + "#projects"))
    try:
        projects.project_delete(project=project)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Project “{project.name}” deleted.")
    return redirect("console:account")


@login_required
@require_http_methods(["GET", "POST"])
def project_detail(request, project_id):
    """A project: its month against its budget, and the budget form (soft or hard cap)."""
    project = _own_project(request, project_id)
    if project is None:
        return redirect("console:account")
    status = 200
    if request.method == "POST":
        form = ProjectBudgetForm(request.POST)
        if form.is_valid():
            try:
                projects.project_budget_set(project=project, monthly_budget=form.cleaned_data["monthly_budget"],
                                            budget_cap=form.cleaned_data["budget_cap"])
            except DomainError as exc:
                add_domain_error(form, exc)
            else:
                budget = project.monthly_budget
                messages.success(request, f"Project “{project.name}”: no budget." if budget is None else
                                 f"Project “{project.name}”: a {project.budget_cap} cap at {usd(budget)} a month.")
                return redirect("console:project", project_id=project.pk)
        mark_invalid(form)
        status = 400
    else:
        form = ProjectBudgetForm(initial={"monthly_budget": project.monthly_budget, "budget_cap": project.budget_cap})
    state = budgets.budget_state(project=project, now=timezone.now())
    return render(request, "console/project.html", {
        "project": project, "state": state, "form": form, "nav": "account",
        "notice_minutes": int(market("BUDGET_NOTICE_SECONDS") // 60),
        "hold_minutes": int(market("MIN_PREPAID_SECONDS") // 60),
        "pct": min(100, int(state.share * 100)) if state.share is not None else None}, status=status)


@login_required
@require_POST
def notifications_save(request):
    return _submit(request, NotificationSettingsForm(request.POST, prefix="notify"), "notification_form",
                   lambda data: notifications.notification_settings_update(user=request.user, **data),
                   lambda _: "Notification settings saved.")


@login_required
@require_POST
def ssh_key_add(request):
    return _submit(request, SshKeyForm(request.POST, prefix="ssh"), "ssh_form",
                   lambda data: workloads.ssh_key_add(user=request.user, **data),
                   lambda key: f"SSH key “{key.name}” added ({key.fingerprint}): containers started from now on "
                               f"let it log in.", to="/account/#ssh-keys")


@login_required
@require_http_methods(["GET", "POST"])
def ssh_key_delete(request, key_id):
    if request.method == "GET":
        key = SshKey.objects.filter(pk=key_id, user=request.user).first()
        if key is None:
            messages.error(request, "No such SSH key among yours.")
            return redirect("/account/#ssh-keys")
        return confirm_page(request, Confirm(
            title=f"Remove the SSH key “{key.name}”?",
            points=[f"Containers started from now on do not let {key.fingerprint} log in.",
                    "Containers running now keep it until their lease ends."],
            action="Remove key", keep="Keep it", back="/account/#ssh-keys"))
    try:
        workloads.ssh_key_delete(user=request.user, key_id=key_id)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "SSH key removed: containers started from now on do not have it.")
    return redirect("/account/#ssh-keys")


@login_required
@require_POST
def two_factor(request):
    """Turn the second factor on (a key, then a code from the app), off (a code), or make new recovery codes."""
    action, user = request.POST.get("action"), request.user
    if action == "begin":
        try:
            totp.totp_begin(user=user)
        except DomainError as exc:
            messages.error(request, exc.message)
        return redirect("/account/#two-factor")
    form = CodeForm(request.POST, prefix="totp")
    acts = {"confirm": totp.totp_confirm, "disable": totp.totp_disable, "recovery": totp.recovery_codes_renew}
    if action not in acts:
        messages.error(request, "Choose what to do with two-factor authentication.")
        return redirect("/account/#two-factor")
    if form.is_valid():
        try:
            codes = acts[action](user=user, code=form.cleaned_data["code"])
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            if action == "disable":
                messages.success(request, "Two-factor authentication is off: your password alone logs you in.")
                return redirect("/account/#two-factor")
            # Recovery codes are in this response only, like a new API key.
            return _page(request, recovery_codes=codes)
    mark_invalid(form)
    return _page(request, totp_form=form, status=400)
