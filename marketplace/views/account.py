"""Account pages: API keys (created, shown once, revoked), SSH keys, projects and notification settings."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from marketplace import notifications
from marketplace.models import ApiKey, Project, SshKey
from marketplace.products import apikeys, projects, workloads
from scheduler.errors import DomainError

from ..forms import ApiKeyForm, NotificationSettingsForm, ProjectForm, SshKeyForm
from .common import add_domain_error, mark_invalid


def _notification_form(user) -> NotificationSettingsForm:
    row = notifications.notification_settings_for(user=user)
    return NotificationSettingsForm(prefix="notify", initial={
        "webhook_url": row.webhook_url, **{kind: getattr(row, kind) for kind in row.KINDS}})


def _page(request, *, key_form=None, project_form=None, notification_form=None, ssh_form=None, secret=None,
          new_key=None, status=200):
    return render(request, "console/account.html", {
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
@require_POST
def api_key_revoke(request, key_id):
    try:
        key = apikeys.api_key_revoke(user=request.user, key_id=key_id)
    except ApiKey.DoesNotExist:
        messages.error(request, "No such API key among yours.")
    else:
        messages.success(request, f"API key “{key.name}” is revoked, with the keys made with it: requests with them "
                                  f"are refused from now on.")
    return redirect("console:account")


@login_required
@require_POST
def project_create(request):
    return _submit(request, ProjectForm(request.POST, prefix="project"), "project_form",
                   lambda data: projects.project_create(user=request.user, **data),
                   lambda project: f"Project “{project.name}” created.")


@login_required
@require_POST
def project_delete(request, project_id):
    project = Project.objects.filter(pk=project_id, user=request.user).first()
    if project is None:
        messages.error(request, "No such project among yours.")
        return redirect("console:account")
    try:
        projects.project_delete(project=project)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Project “{project.name}” deleted.")
    return redirect("console:account")


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
@require_POST
def ssh_key_delete(request, key_id):
    try:
        workloads.ssh_key_delete(user=request.user, key_id=key_id)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "SSH key removed: containers started from now on do not have it.")
    return redirect("/account/#ssh-keys")
