"""My leases: each lease's state, its container (state, connection facts, a live log tail and its download),
cost so far (ticking live), live charts of its GPU and interruption notices with a countdown; my jobs with their
exit codes. Ending a lease goes through marketplace.lifecycle.leases.lease_end."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from marketplace import metering, selectors as market_selectors
from marketplace.amounts import micro, usd, usd_per_hour
from marketplace.api.workloads import logs_response
from marketplace.conf import market
from marketplace.lifecycle import leases as lease_services, workloads
from marketplace.lifecycle.reliability import lease_failure_report
from marketplace.models import Lease, Mode, Order
from marketplace.money import ledger
from marketplace.products import orders as order_services
from scheduler import selectors as fleet_selectors
from scheduler.errors import DomainError

from ..forms import LeaseFailureReportForm
from .common import Confirm, confirm_page

PAGE = 50


def _lease_or_404(request, lease_id) -> Lease:
    lease = market_selectors.lease_list(user=request.user).filter(pk=lease_id).first()
    if lease is None:
        raise Http404("no such lease among yours")
    return lease


def _row(lease: Lease, now=None) -> dict:
    ran = ((lease.ended_at or now or timezone.now()) - lease.started_at).total_seconds() if lease.started_at else 0
    return {"lease": lease, "facts": lease_services.connection_facts(lease), "ran_seconds": max(0, int(ran)),
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


def _history(lease: Lease) -> dict:
    """An ended lease's GPU over its run, for the page's charts (per minute; per hour past two days)."""
    if lease.state in Lease.OPEN_STATES or lease.started_at is None:
        return {"minutes": 0}
    end = lease.ended_at or timezone.now()
    step, points = fleet_selectors.gpu_history(gpu_id=lease.slice.gpu_id, start=lease.started_at, end=end)
    series = {"t": [int(p["at"].timestamp()) for p in points],
              "util": [p["util"] for p in points], "temp": [p["temp"] for p in points],
              "power": [p["power"] for p in points],
              "mem": [None if p["mem_used"] is None else round(p["mem_used"] / 1024, 2) for p in points],
              # From the start of its first minute: each point is a minute's average, drawn at the minute's start.
              "span": [int(lease.started_at.replace(second=0, microsecond=0).timestamp()), int(end.timestamp())]}
    return {"minutes": len(points), "step": step, "series": series}


@login_required
def lease_detail(request, lease_id):
    lease = _lease_or_404(request, lease_id)
    keep = market("WORKLOAD_LOG_TAIL_BYTES")
    report = getattr(lease, "failure_report", None)
    reportable = report is None and (lease.started_at is not None or lease.state == Lease.State.FAILED)
    return render(request, "console/lease.html", {**_row(lease), "now": timezone.now(), "nav": "leases",
                                                  "log_keep_bytes": keep, "log_keep_kib": keep // 1024,
                                                  "history": _history(lease), "failure_report": report,
                                                  "report_form": LeaseFailureReportForm() if reportable else None})


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


def _end_confirm(lease: Lease, cost) -> Confirm:
    short = str(lease.pk)[:8]
    points = [f"Billing stops now: it has cost {usd(cost)} so far, at {usd_per_hour(lease.price_per_hour)}."]
    if workloads.workload_of(lease) is not None:
        points.append(f"Its container is stopped (SIGTERM, then killed after "
                      f"{market('WORKLOAD_STOP_GRACE_SECONDS'):g} s) and its slice destroyed: whatever it has not "
                      f"saved elsewhere is lost.")
    else:
        points.append("Its slice is destroyed: whatever is on it and not saved elsewhere is lost.")
    points.append("It cannot be started again: a new order gets a new slice.")
    return Confirm(title=f"End lease {short}?", points=points, action="End lease", keep="Keep it running",
                   back=reverse("console:lease", args=[lease.pk]),
                   refused="" if lease.state in Lease.OPEN_STATES and lease.mode != Mode.RESERVED else
                   ("A reserved window's lease ends with its window." if lease.state in Lease.OPEN_STATES
                    else f"The lease is {lease.get_state_display()} already."))


@login_required
@require_http_methods(["GET", "POST"])
def lease_end(request, lease_id):
    lease = _lease_or_404(request, lease_id)
    if request.method == "GET":
        return confirm_page(request, _end_confirm(lease, _row(lease)["cost"]))
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


@login_required
@require_POST
def lease_report_failure(request, lease_id):
    """The buyer reports that its lease failed on the provider's side (once); back to the lease's page."""
    lease = _lease_or_404(request, lease_id)
    form = LeaseFailureReportForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose what went wrong to report the failure.")
        return redirect("console:lease", lease_id=lease.pk)
    try:
        lease_failure_report(buyer=request.user, lease_id=lease.pk, **form.cleaned_data)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "Thank you: the failure is recorded and counts against the node's reliability score.")
    return redirect("console:lease", lease_id=lease.pk)
