"""Billing: balance, top-up with Stripe.js, the ledger with filters, monthly statements per project (CSV
too) and spending charts by project and by GPU model. Money moves only through marketplace.money
(through products/payments.py); this module reads and renders."""
from __future__ import annotations

import csv
from collections import defaultdict
from datetime import datetime, time, timezone as dt_timezone
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpResponse, JsonResponse
from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from marketplace.models import Lease, Payment, Project
from marketplace.money import ledger, statements
from nodeagent.hardware.gpus import name_of
from marketplace.products import payments
from scheduler.errors import DomainError

from marketplace.amounts import usd

from ..forms import AutoTopUpForm, LedgerFilterForm, TopUpForm
from .common import add_domain_error, mark_invalid, month_param

PAGE = 50


def _activity(request, form: LedgerFilterForm):
    """The wallet's movements for the ledger table (usage one row per lease), with the filters that are valid."""
    d = form.cleaned_data if form.is_valid() else {}
    if form.errors:
        mark_invalid(form)
    return statements.wallet_activity(
        user=request.user, kind=d.get("kind") or None, project_id=d.get("project"),
        since=datetime.combine(d["since"], time.min, tzinfo=dt_timezone.utc) if d.get("since") else None,
        until=datetime.combine(d["until"], time.max, tzinfo=dt_timezone.utc) if d.get("until") else None)


def _with_leases(rows) -> list[dict]:
    """Usage rows with what their lease was (mode, unit), read in one query for the page."""
    rows = list(rows)
    ids = {r["lease"] for r in rows if r["kind"] == "usage" and r["lease"]}
    leases = {lease.pk: lease for lease in Lease.objects.filter(pk__in=ids).select_related("slice__gpu__gpu_model")}
    for r in rows:
        r["lease_row"] = leases.get(r["lease"]) if r["kind"] == "usage" else None
        r["label"] = statements.KIND_LABELS.get(r["kind"], r["kind"])
    return rows


def _spending(body: dict) -> dict:
    """Bars for the statement's month: spending per project and per GPU model."""
    by_project = [(p["project"]["name"] if p["project"] else "no project", Decimal(p["total"])) for p in body["projects"]]
    models: dict[str, Decimal] = defaultdict(Decimal)
    for p in body["projects"]:
        for s in p["slices"]:
            models[s["gpu_model"]] += Decimal(s["amount"])
    by_model = sorted(((name_of(k), v) for k, v in models.items()), key=lambda kv: -kv[1])

    def bars(rows):
        # Lengths from the exact amounts, labels by the console's money rule: two bars of different length never
        # read the same (a sub-cent amount is written to the hundredth of a cent, amounts.usd).
        top = max((v for _, v in rows), default=Decimal("0")) or Decimal("1")
        return [{"label": k, "amount": v, "pct": max(0, int(v / top * 100))} for k, v in rows]
    return {"by_project": bars(by_project), "by_model": bars(by_model)}


def _without_page(params) -> str:
    """The page's filters for its pager links (which add their own page)."""
    params = params.copy()
    params.pop("page", None)
    return params.urlencode() + "&" if params else ""


@login_required
def billing(request, *, auto_form=None):
    auto = payments.auto_topup_of(user=request.user)
    form = LedgerFilterForm(request.GET or None, user=request.user)
    month = month_param(request)
    project_id = request.GET.get("statement_project") or None
    try:
        body = statements.statement(user=request.user, month=month, project_id=project_id)
    except DomainError:
        body, project_id = statements.statement(user=request.user, month=month), None
    page = Paginator(_activity(request, form), PAGE).get_page(request.GET.get("page"))
    return render(request, "console/billing.html", {
        "balance": ledger.wallet_balance(user=request.user), "topup_form": TopUpForm(), "ledger_form": form,
        "page": page, "ledger_rows": _with_leases(page), "statement": body,
        "credits": Decimal(body["totals"]["credits_amount"]), "month": month, "spending": _spending(body),
        "projects": Project.objects.filter(user=request.user).order_by("name"), "statement_project": project_id,
        "payments": Payment.objects.filter(user=request.user).order_by("-created_at")[:10],
        "stripe_js": payments.stripe_js_url() if settings.STRIPE_SECRET_KEY else None,
        "stripe_pk": settings.STRIPE_PUBLISHABLE_KEY, "fake_stripe": bool(settings.STRIPE_API_BASE),
        "auto": auto, "auto_form": auto_form or AutoTopUpForm(prefix="auto", initial={
            "enabled": auto.enabled, "threshold": auto.threshold, "amount": auto.amount}),
        "query": request.GET.urlencode(), "nav": "billing", "ledger_query": _without_page(request.GET)}, status=400 if form.errors else 200)


@login_required
def balance_fragment(request):
    return render(request, "console/_balance.html", {"balance": ledger.wallet_balance(user=request.user)})


@login_required
@require_POST
def topup(request):
    """Open a top-up (JSON for the page's script). With the real Stripe, the page confirms the card with
    Stripe.js (confirmCardPayment). The local fake Stripe.js cannot attach a card to a PaymentIntent, so
    there the page hands the number its fake card element collected to the server-side confirm, and Stripe.js
    finishes any 3-D Secure step. Either way the wallet is credited when Stripe says the payment succeeded."""
    form = TopUpForm(request.POST)
    if not form.is_valid():
        return JsonResponse({"errors": {k: [str(e) for e in v] for k, v in form.errors.items()}}, status=400)
    card = request.POST.get("card") if settings.STRIPE_API_BASE else None
    try:
        payment = payments.topup_create(user=request.user, amount=form.cleaned_data["amount"], card=card or None,
                                        client_key=request.POST.get("idempotency_key") or None)
    except DomainError as exc:
        return JsonResponse({"errors": {exc.field if exc.field in ("amount", "card") else "__all__": [exc.message]}},
                            status=exc.status)
    return JsonResponse({"payment": str(payment.pk), "status": payment.status,
                         "client_secret": getattr(payment, "client_secret", None)}, status=201)


@login_required
@require_POST
def auto_topup_save(request):
    """Auto top-up's settings: on or off, the threshold and the amount."""
    form = AutoTopUpForm(request.POST, prefix="auto")
    if form.is_valid():
        try:
            row = payments.auto_topup_configure(user=request.user, **form.cleaned_data)
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, f"Auto top-up is on: {usd(row.amount)} whenever the wallet is under "
                                      f"{usd(row.threshold)}." if row.enabled else "Auto top-up is off.")
            return redirect(reverse("console:billing") + "#auto-topup")
    mark_invalid(form)
    request.method = "GET"
    response = billing(request, auto_form=form)
    response.status_code = 400
    return response


@login_required
@require_POST
def auto_topup_card(request):
    """Start saving a card (JSON for the page's script): the SetupIntent's client secret, which Stripe.js confirms
    with the card element (confirmCardSetup)."""
    try:
        _, secret = payments.card_setup_start(user=request.user)
    except DomainError as exc:
        return JsonResponse({"errors": {"__all__": [exc.message]}}, status=exc.status)
    return JsonResponse({"client_secret": secret}, status=201)


@login_required
@require_POST
def auto_topup_card_done(request):
    """Keep the card once Stripe says its SetupIntent succeeded."""
    try:
        row = payments.card_setup_finish(user=request.user)
    except DomainError as exc:
        return JsonResponse({"errors": {"__all__": [exc.message]}}, status=exc.status)
    messages.success(request, f"Card saved for auto top-up: {row.card_label}.")
    return JsonResponse({"card": row.card_label})


@login_required
def statement_csv(request):
    month = month_param(request)
    try:
        body = statements.statement(user=request.user, month=month,
                                    project_id=request.GET.get("statement_project") or None)
    except DomainError as exc:
        return HttpResponse(exc.message, status=exc.status, content_type="text/plain")
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="statement-{month}.csv"'
    csv.writer(response).writerows(statements.statement_csv_rows(body))
    return response
