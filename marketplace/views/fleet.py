"""Provider pages: nodes, a node's GPUs and live charts, registration, renaming, cordon/uncordon, drain and delete."""
from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from marketplace.models import ProviderProfile
from scheduler import selectors as fleet_selectors
from scheduler.errors import DomainError
from scheduler.models import Node
from scheduler.services import health as health_services, nodes as node_services

from ..forms import NodeRegisterForm, NodeRenameForm, NodeSettingsForm
from .common import Confirm, add_domain_error, confirm_page, is_htmx, mark_invalid
from .earnings import earnings_summary


def home(request):
    return redirect("console:catalog")


@login_required
def nodes(request):
    return render(request, "console/nodes.html", {"nodes": fleet_selectors.node_list(user=request.user),
                                                  "earnings": earnings_summary(request.user), "nav": "nodes",
                                                  "is_provider": ProviderProfile.role_of(request.user)})


def _node_or_404(request, node_id) -> Node:
    try:
        return fleet_selectors.node_get(user=request.user, node_id=node_id)
    except (Node.DoesNotExist, ValueError):
        raise Http404("no such node") from None


def _gpu_rows(node: Node) -> list[dict]:
    rows = []
    for gpu in fleet_selectors.node_gpus(node=node):
        geometry = gpu.geometry()
        rows.append({"gpu": gpu, "layout": fleet_selectors.gpu_layout(gpu),
                     "slots": geometry.memory_slices if geometry else 1})
    return rows


@login_required
def node_detail(request, node_id, settings_form=None, rename_form=None, status=200):
    node = _node_or_404(request, node_id)
    form = settings_form or NodeSettingsForm(initial={
        "public_address": node.public_address, "port_range_start": node.port_range_start,
        "port_range_end": node.port_range_end, "cpus_per_gpu": node.cpus_per_gpu,
        "ram_gb_per_gpu": node.ram_gb_per_gpu, "image_allowlist": "\n".join(node.image_allowlist or [])})
    rows = _gpu_rows(node)
    return render(request, "console/node_detail.html", {
        "node": node, "gpus": rows, "events": fleet_selectors.node_events(node=node), "nav": "nodes",
        "detail": node.reliability_detail, "reliability_gpus": [r["gpu"] for r in rows],
        "window_days": settings.RELIABILITY["WINDOW_DAYS"], "settings_form": form, "rename_form": rename_form or NodeRenameForm(initial={"name": node.name})},
        status=status)


def _node_form(request, node_id, form, *, slot: str, act, said):
    """A posted form of the node page: valid input goes to the service (`act(node, data)`), then a message (`said`
    of the node) and back to the page; invalid input or a refusal shows the page again with the form's errors."""
    node = _node_or_404(request, node_id)
    if form.is_valid():
        try:
            with transaction.atomic():
                act(node, form.cleaned_data)
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, said(node))
            return redirect("console:node", node_id=node.pk)
    mark_invalid(form)
    return node_detail(request, node_id, status=400, **{slot: form})


@login_required
@require_POST
def node_rename(request, node_id):
    return _node_form(request, node_id, NodeRenameForm(request.POST), slot="rename_form",
                      act=lambda node, data: node_services.node_rename(node=node, **data),
                      said=lambda node: f"The node is now called {node.name}.")


@login_required
def node_delete(request, node_id):
    """GET: what deleting the node does, or why it cannot be deleted yet; POST (the confirm button): delete it."""
    node = _node_or_404(request, node_id)
    if request.method == "POST":
        try:
            node_services.node_delete(node=node, by=request.user.get_username())
        except DomainError as exc:
            messages.error(request, exc.message)
            return redirect("console:node-delete", node_id=node.pk)
        messages.success(request, f"{node.name} is deleted: its token no longer works and its agent was told to stop. "
                                  f"Its past leases and earnings stay in your statements.")
        return redirect("console:nodes")
    held = fleet_selectors.node_holders(node=node)
    where = f"{node.region}, {node.hostname}" if node.hostname else node.region
    return confirm_page(request, Confirm(
        title=f"Delete {node.name}?",
        points=[f"{node.name} ({where}): its agent token stops working at once; a connected agent is told the node "
                "was deleted and stops.",
                "Its GPUs take no more work, and it leaves your nodes.",
                "Its past leases, usage and earnings stay in your statements.",
                f"The name {node.name} is free for a new node: to run this server again, register a node and start "
                "its agent with the new token."],
        action=f"Delete {node.name}", keep="Keep it", back=reverse("console:node", args=[node.pk]),
        refused=(f"{node.name} cannot be deleted yet: it still has {held}. Drain it so that no new work is placed "
                 "on it, and delete it once these have ended.") if held else ""))


@login_required
@require_POST
def node_settings(request, node_id):
    """The provider's terms for buyers' containers on the node."""
    return _node_form(request, node_id, NodeSettingsForm(request.POST), slot="settings_form",
                      act=lambda node, data: node_services.node_settings_update(node=node, **data),
                      said=lambda node: "Container settings saved: they apply to containers started from now on.")


@login_required
def node_gpus_fragment(request, node_id):
    node = _node_or_404(request, node_id)
    # htmx also swaps the status pill and the node's facts out of band: they change with the same events.
    return render(request, "console/_node_gpus.html", {"node": node, "gpus": _gpu_rows(node), "oob": is_htmx(request)})


@login_required
@require_POST
def gpu_health(request, node_id, gpu_id):
    """Cordon or uncordon one of the provider's GPUs (a plain POST; htmx swaps the GPU table)."""
    node = _node_or_404(request, node_id)
    gpu = node.gpus.filter(pk=gpu_id, present=True).first()  # one row; the table is re-read after the change
    if gpu is None:
        raise Http404("no such GPU on this node")
    action = request.POST.get("action")
    level = "success"
    source = health_services.cordon_source_of(request.user)
    if action == "cordon":
        default = "cordoned by an operator" if request.user.is_staff else "cordoned by its provider"
        reason = (request.POST.get("reason") or "").strip()[:150] or default
        health_services.gpu_cordon(gpu_id=gpu.pk, reason=reason, by=request.user.get_username(), source=source)
        said = f"gpu{gpu.index} is cordoned: no new work is placed on it."
    elif action == "uncordon":
        try:
            health_services.gpu_uncordon(gpu_id=gpu.pk, by=request.user.get_username(), source=source)
        except DomainError as exc:
            level, said = "error", exc.message[:1].upper() + exc.message[1:] + "."
        else:
            said = f"gpu{gpu.index} is back in service."
    else:
        level, said = "error", "Choose cordon or uncordon."
    if is_htmx(request):
        # Said in the page that acted, with the table it changed: a flash message stored for "the next page" would
        # only surface later, on a page it has nothing to do with.
        return render(request, "console/_node_gpus.html", {"node": node, "gpus": _gpu_rows(node), "oob": True,
                                                           "notice": said, "notice_level": level})
    getattr(messages, level)(request, said)
    return redirect("console:node", node_id=node.pk)


@login_required
@require_http_methods(["GET", "POST"])
def node_drain(request, node_id):
    """Drain (no new work; running leases stay) or undrain the provider's node. Draining asks first (GET)."""
    node = _node_or_404(request, node_id)
    if request.method == "GET":
        return confirm_page(request, Confirm(
            title=f"Drain {node.name}?",
            points=["Nothing new is placed on it: no new leases, no new reserved windows.",
                    "Its running leases keep running until they end.",
                    "Windows already booked on it start on another GPU of the same kind when their time comes (their "
                    "holders are refunded any time the platform cannot deliver).",
                    "It earns only from what already runs until you undrain it."],
            action="Drain node", keep="Keep taking work", back=reverse("console:node", args=[node.pk]),
            fields={"action": "drain"},
            refused=f"{node.name} is draining already." if node.drain_requested else ""))
    if request.POST.get("action") == "undrain":
        try:
            node_services.node_undrain(node=node, by_operator=request.user.is_staff)
        except DomainError as exc:
            messages.error(request, exc.message[:1].upper() + exc.message[1:] + ".")
        else:
            messages.success(request, f"{node.name} takes new work again.")
    else:
        node_services.node_drain(node=node, by_operator=request.user.is_staff)
        messages.success(request, f"{node.name} is draining: running leases stay until they end, no new work.")
    return redirect("console:node", node_id=node.pk)


@login_required
def node_register(request):
    if not ProviderProfile.role_of(request.user):
        messages.info(request, "Only providers register nodes: become one first (it takes a minute).")
        return redirect(f"{reverse('console:provider')}?next={reverse('console:node-register')}")
    form = NodeRegisterForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            node, token = node_services.node_register(provider=request.user, **form.cleaned_data)
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            from scheduler.api import agent_command_line

            return render(request, "console/node_register.html", {
                "node": node, "token": token, "command": agent_command_line(request, token), "nav": "register"})
    mark_invalid(form)
    return render(request, "console/node_register.html", {"form": form, "nav": "register"},
                  status=400 if form.errors else 200)
