"""A provider's Earnings page: the month per lease or reserved window, per node and in total (they add up), the last
six months, what is payable now, on hold and paid, a payout request, the payouts so far, and the Stripe Connect
payout account. Reads come from marketplace.money (earnings, payouts); writes go through
marketplace.products.payouts. A buyer's order or project is never shown here."""
from __future__ import annotations

from decimal import Decimal

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from marketplace.models import Payout, ProviderProfile
from marketplace.money import earnings as earnings_selectors
from marketplace.products import payouts
from scheduler.errors import DomainError

from ..forms import PayoutRequestForm
from .common import add_domain_error, mark_invalid, month_param

PAGE = 50


def earnings_summary(user, month: str | None = None) -> dict:
    """The month's earnings (per lease, per node, totals) and net earnings of the last six months as bars: what the
    Earnings page and the nodes page both show."""
    body = earnings_selectors.earnings(user=user, month=month)
    months = earnings_selectors.monthly_net(user=user)
    top = max([m["net"] for m in months] + [Decimal("0")]) or Decimal("1")
    return {"current": body, "months": [{**m, "pct": int(max(m["net"], 0) / top * 100)} for m in months]}


def _page(request, *, form: PayoutRequestForm | None = None, status: int = 200):
    user = request.user
    month = month_param(request)
    summary = earnings_summary(user, month)
    profile = ProviderProfile.objects.filter(user=user).first()
    balance = payouts.payout_balance(provider=user) if profile is not None else None
    if form is None and balance is not None:
        form = PayoutRequestForm(initial={"amount": balance.payable_cents})
    return render(request, "console/earnings.html", {
        "earnings": summary, "month": month, "leases": Paginator(summary["current"]["leases"], PAGE).get_page(
            request.GET.get("page")),
        "profile": profile, "balance": balance, "form": form, "simulated": payouts.transfers_simulated(),
        "history": Payout.objects.filter(provider=user).order_by("-requested_at")[:50],
        "bank_failure": payouts.bank_payout_failure(provider=user) if profile is not None else None,
        "nav": "earnings"}, status=status)


@login_required
def earnings(request):
    return _page(request)


@login_required
@require_POST
def payout_request(request):
    form = PayoutRequestForm(request.POST)
    if form.is_valid():
        try:
            payout = payouts.payout_request(provider=request.user, amount=form.cleaned_data["amount"])
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, f"Payout of ${payout.amount:,.2f} requested: an operator approves it, then it is "
                                      f"transferred to your payout account.")
            return redirect("console:earnings")
    mark_invalid(form)
    return _page(request, form=form, status=400)


@login_required
@require_POST
def payout_cancel(request, payout_id):
    try:
        payouts.payout_cancel(provider=request.user, payout_id=payout_id)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "The payout request is cancelled: its amount is payable again.")
    return redirect("console:earnings")


def _onboarding(request):
    """Send the provider to Stripe's onboarding of its payout account (a new link each time: they are single use)."""
    try:
        url = payouts.payout_account_connect(
            provider=request.user, refresh_url=request.build_absolute_uri(reverse("console:payout-account-refresh")),
            return_url=request.build_absolute_uri(reverse("console:payout-account-return")))
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect("console:earnings")
    return redirect(url)


@login_required
@require_POST
def payout_account_connect(request):
    return _onboarding(request)


@login_required
def payout_account_refresh(request):
    """Stripe sends the provider here when an onboarding link expired or was used: a fresh one (its account exists)."""
    if not ProviderProfile.objects.filter(user=request.user).exclude(stripe_account_id="").exists():
        return redirect("console:earnings")
    return _onboarding(request)


@login_required
def payout_account_return(request):
    """Back from Stripe's onboarding: say whether the account takes payouts now."""
    status = payouts.payout_account_status(provider=request.user)
    if status is not None and status.ready:
        messages.success(request, "Your payout account is connected: approved payouts are transferred to it.")
    elif status is not None:
        messages.warning(request, "Stripe still needs some details before it pays you out"
                                  + (f" ({', '.join(status.requirements_due[:5])})" if status.requirements_due else "")
                                  + ": connect the payout account again to finish.")
    else:
        messages.error(request, "Stripe could not tell whether your payout account is ready; try again shortly.")
    return redirect("console:earnings")
