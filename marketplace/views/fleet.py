"""Console pages. Thin: parse input, call a selector or service, render."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render

from scheduler import selectors as fleet_selectors
from scheduler.errors import DomainError
from scheduler.models import Node
from scheduler.services import nodes as node_services

from .forms import NodeRegisterForm


@login_required
def home(request):
    return redirect("console:nodes")


@login_required
def nodes(request):
    return render(request, "console/nodes.html", {"nodes": fleet_selectors.node_list(user=request.user), "nav": "nodes"})


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
def node_detail(request, node_id):
    node = _node_or_404(request, node_id)
    return render(request, "console/node_detail.html", {
        "node": node, "gpus": _gpu_rows(node), "events": fleet_selectors.node_events(node=node), "nav": "nodes"})


@login_required
def node_gpus_fragment(request, node_id):
    node = _node_or_404(request, node_id)
    return render(request, "console/_node_gpus.html", {"node": node, "gpus": _gpu_rows(node)})


@login_required
def node_register(request):
    form = NodeRegisterForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            node, token = node_services.node_register(provider=request.user, **form.cleaned_data)
        except DomainError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            from scheduler.api import agent_command_line

            return render(request, "console/node_register.html", {
                "node": node, "token": token, "command": agent_command_line(request, token), "nav": "register"})
    for name, field in form.fields.items():
        if form.errors.get(name):
            field.widget.attrs.update({"aria-invalid": "true", "aria-describedby": f"id_{name}-error"})
    return render(request, "console/node_register.html", {"form": form, "nav": "register"},
                  status=400 if form.errors else 200)
