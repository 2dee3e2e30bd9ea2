"""Reservations (calendar and list) with 'list for resale' and its cap, and the public resale market with
filters and one-step purchase. Writes go through marketplace.products.resale."""
from __future__ import annotations

from datetime import datetime, time, timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from marketplace.models import Reservation
from marketplace import selectors as market_selectors
from marketplace.money import ledger
from marketplace.products import resale as resale_services
from scheduler.errors import DomainError

from ..forms import ListForResaleForm, ResaleFilterForm
from .common import add_domain_error, mark_invalid

PAGE = 50
CAL_DAYS = 14
LISTING_FIELDS = {"starts_at": "starts_at", "ends_at": "ends_at", "ask_per_hour": "ask_per_hour",
                  "reservation": None}


def _reservations(request):
    return list(market_selectors.reservation_list(user=request.user)
                .prefetch_related("listings").order_by("starts_at")[:500])


def _calendar(reservations, now):
    """Two weeks from today, each day with the reservations that touch it."""
    day0 = datetime.combine(now.date(), time.min, tzinfo=now.tzinfo)
    days = []
    for d in range(CAL_DAYS):
        a, b = day0 + timedelta(days=d), day0 + timedelta(days=d + 1)
        days.append({"day": a, "items": [r for r in reservations if r.starts_at < b and r.ends_at > a
                                         and r.state in Reservation.LIVE_STATES]})
    return days


def _page(request, *, forms=None, status=200):
    now = timezone.now()
    reservations = _reservations(request)
    rows = []
    for r in reservations:
        form = (forms or {}).get(str(r.pk)) or ListForResaleForm(prefix=str(r.pk), initial={
            "starts_at": max(r.starts_at, now + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M"),
            "ends_at": r.ends_at.strftime("%Y-%m-%dT%H:%M")})
        rows.append({"r": r, "cap": resale_services.resale_cap(reservation=r) if r.state in Reservation.LIVE_STATES
                     else None, "form": form, "listings": list(r.listings.all()),
                     "listable": r.state in Reservation.LIVE_STATES and r.ends_at > now})
    mine = market_selectors.listing_list(include_closed=True).filter(seller=request.user).order_by("-created_at")[:100]
    return render(request, "console/reservations.html", {
        "rows": rows, "my_listings": mine, "calendar": _calendar(reservations, now), "nav": "reservations",
        "balance": ledger.wallet_balance(user=request.user)}, status=status)


@login_required
def reservations(request):
    return _page(request)


@login_required
@require_POST
def list_for_resale(request, reservation_id):
    form = ListForResaleForm(request.POST, prefix=str(reservation_id))
    if form.is_valid():
        try:
            listing = resale_services.listing_create(seller=request.user, reservation_id=reservation_id,
                                                     **form.cleaned_data)
        except DomainError as exc:
            add_domain_error(form, exc, fields=LISTING_FIELDS)
        else:
            messages.success(request, f"Listed {listing.starts_at:%b %d %H:%M}–{listing.ends_at:%H:%M} UTC at "
                                      f"${listing.ask_per_hour:.4f}/h on the resale market.")
            return redirect("console:reservations")
    mark_invalid(form)
    return _page(request, forms={str(reservation_id): form}, status=400)


@login_required
@require_POST
def listing_cancel(request, listing_id):
    try:
        resale_services.listing_cancel(seller=request.user, listing_id=listing_id)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "The listing is withdrawn: the window is yours again.")
    return redirect("console:reservations")


def resale_market(request):
    """Public: open listings with filters; buying takes one click (and a login)."""
    form = ResaleFilterForm(request.GET or None)
    filters = {}
    if form.is_bound:
        if form.is_valid():
            filters = {k: v for k, v in form.cleaned_data.items() if v not in (None, "")}
        else:
            mark_invalid(form)
    qs = market_selectors.listing_list(**filters)
    page = Paginator(qs, PAGE).get_page(request.GET.get("page"))
    return render(request, "console/resale.html", {
        "form": form, "page": page, "nav": "resale", "query": request.GET.urlencode(),
        "balance": ledger.wallet_balance(user=request.user) if request.user.is_authenticated else None},
        status=400 if form.errors else 200)


@login_required
@require_POST
def resale_buy(request, listing_id):
    try:
        purchase = resale_services.listing_purchase(buyer=request.user, listing_id=listing_id)
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect("console:resale")
    r = purchase.reservation
    messages.success(request, f"Bought: {r.starts_at:%b %d %H:%M}–{r.ends_at:%H:%M} UTC is yours "
                              f"(${purchase.listing.price_total} paid).")
    return redirect("console:reservations")
