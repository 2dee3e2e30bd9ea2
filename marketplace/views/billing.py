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
from django.shortcuts import render
from django.views.decorators.http import require_POST

from marketplace.models import Account, LedgerEntry, Payment, Project
from marketplace.money import ledger, statements
from marketplace.products import payments
from scheduler.errors import DomainError

from ..forms import LedgerFilterForm, TopUpForm
from .common import mark_invalid, month_param

PAGE = 50


def _ledger(request, form: LedgerFilterForm):
    qs = (LedgerEntry.objects.filter(account__user=request.user, account__kind=Account.Kind.WALLET)
          .select_related("transaction", "project").order_by("-created_at", "-pk"))
    if form.is_valid():
        d = form.cleaned_data
        if d.get("kind"):
            qs = qs.filter(transaction__kind=d["kind"])
        if d.get("since"):
            qs = qs.filter(created_at__gte=datetime.combine(d["since"], time.min, tzinfo=dt_timezone.utc))
        if d.get("until"):
            qs = qs.filter(created_at__lte=datetime.combine(d["until"], time.max, tzinfo=dt_timezone.utc))
        if d.get("project"):
            qs = qs.filter(project_id=d["project"])
    else:
        mark_invalid(form)
    return qs


def _spending(body: dict) -> dict:
    """Bars for the statement's month: spending per project and per GPU model."""
    by_project = [(p["project"]["name"] if p["project"] else "no project", Decimal(p["total"])) for p in body["projects"]]
    models: dict[str, Decimal] = defaultdict(Decimal)
    for p in body["projects"]:
        for s in p["slices"]:
            models[s["gpu_model"]] += Decimal(s["amount"])
    by_model = sorted(models.items(), key=lambda kv: -kv[1])

    def bars(rows):
        top = max((v for _, v in rows), default=Decimal("0")) or Decimal("1")
        return [{"label": k, "amount": v, "pct": int(v / top * 100)} for k, v in rows]
    return {"by_project": bars(by_project), "by_model": bars(by_model)}


@login_required
def billing(request):
    form = LedgerFilterForm(request.GET or None, user=request.user)
    month = month_param(request)
    project_id = request.GET.get("statement_project") or None
    try:
        body = statements.statement(user=request.user, month=month, project_id=project_id)
    except DomainError:
        body, project_id = statements.statement(user=request.user, month=month), None
    page = Paginator(_ledger(request, form), PAGE).get_page(request.GET.get("page"))
    return render(request, "console/billing.html", {
        "balance": ledger.wallet_balance(user=request.user), "topup_form": TopUpForm(), "ledger_form": form,
        "page": page, "statement": body, "month": month, "spending": _spending(body),
        "projects": Project.objects.filter(user=request.user).order_by("name"), "statement_project": project_id,
        "payments": Payment.objects.filter(user=request.user).order_by("-created_at")[:10],
        "stripe_js": payments.stripe_js_url() if settings.STRIPE_SECRET_KEY else None,
        "stripe_pk": settings.STRIPE_PUBLISHABLE_KEY, "fake_stripe": bool(settings.STRIPE_API_BASE),
        "query": request.GET.urlencode(), "nav": "billing"}, status=400 if form.errors else 200)


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
