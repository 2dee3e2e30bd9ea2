"""My leases: each lease's state, its container (state, connection facts, a live log tail and its download),
cost so far (ticking live), live charts of its GPU and interruption notices with a countdown; my jobs with their
exit codes. Ending a lease goes through marketplace.lifecycle.leases.lease_end."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from marketplace import metering, selectors as market_selectors
from marketplace.amounts import micro
from marketplace.api.workloads import logs_response
from marketplace.conf import market
from marketplace.lifecycle import leases as lease_services, workloads
from marketplace.models import Lease, Order
from marketplace.money import ledger
from marketplace.products import orders as order_services
from scheduler.errors import DomainError

PAGE = 50


def _lease_or_404(request, lease_id) -> Lease:
    lease = market_selectors.lease_list(user=request.user).filter(pk=lease_id).first()
    if lease is None:
        raise Http404("no such lease among yours")
    return lease


def _row(lease: Lease, now=None) -> dict:
    return {"lease": lease, "facts": lease_services.connection_facts(lease),
            "cost": micro(metering.cost_at(lease, now or timezone.now())),
            "interruption": getattr(lease, "interruption", None), "profile": lease.slice.profile or "whole",
            "open": lease.state in Lease.OPEN_STATES, "run": workloads.run_of(lease),
            "workload": workloads.workload_of(lease)}


@login_required
def leases(request):
    qs = market_selectors.lease_list(user=request.user).order_by("-created_at")
    state = request.GET.get("state")
    if state == "open":
        qs = qs.filter(state__in=Lease.OPEN_STATES)
    elif state in Lease.State.values:
        qs = qs.filter(state=state)
    page = Paginator(qs, PAGE).get_page(request.GET.get("page"))
    queued = market_selectors.order_list(user=request.user).filter(state=Order.State.QUEUED)
    return render(request, "console/leases.html", {
        "rows": [_row(lease) for lease in page], "page": page, "queued": queued, "state": state or "",
        "states": Lease.State.choices, "balance": ledger.wallet_balance(user=request.user), "nav": "leases"})


@login_required
def lease_detail(request, lease_id):
    lease = _lease_or_404(request, lease_id)
    keep = market("WORKLOAD_LOG_TAIL_BYTES")
    return render(request, "console/lease.html", {**_row(lease), "now": timezone.now(), "nav": "leases",
                                                  "log_keep_bytes": keep, "log_keep_kib": keep // 1024})


@login_required
def lease_facts(request, lease_id):
    """The lease's state, facts, cost and notice as a fragment (htmx refreshes it on the buyer's events)."""
    lease = _lease_or_404(request, lease_id)
    return render(request, "console/_lease_facts.html", {**_row(lease), "now": timezone.now()})


@login_required
def lease_logs(request, lease_id):
    """The kept tail of the lease's container output, as a download (the API's /leases/{id}/logs/ too)."""
    return logs_response(_lease_or_404(request, lease_id))


@login_required
def jobs(request):
    """The buyer's jobs: leases whose workload runs to completion, with exit codes and how long they ran."""
    qs = (market_selectors.lease_list(user=request.user).filter(order__workload__kind="job")
          .order_by("-created_at"))
    page = Paginator(qs, PAGE).get_page(request.GET.get("page"))
    return render(request, "console/jobs.html", {"rows": [_row(lease) for lease in page], "page": page,
                                                 "nav": "leases"})


@login_required
@require_POST
def lease_end(request, lease_id):
    lease = _lease_or_404(request, lease_id)
    try:
        lease = lease_services.lease_end(lease_id=lease.pk, buyer=request.user)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "The lease is ending: billing stopped now; the slice is being destroyed.")
    return redirect("console:lease", lease_id=lease.pk)


@login_required
@require_POST
def order_cancel(request, order_id):
    try:
        order_services.order_cancel(buyer=request.user, order_id=order_id)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "The order is cancelled.")
    return redirect("console:leases")
