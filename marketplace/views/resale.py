"""Reservations (calendar and list) with 'list for resale' and its cap, and the public resale market with
filters and one-step purchase. Writes go through marketplace.products.resale."""
from __future__ import annotations

from datetime import datetime, time, timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from marketplace import selectors as market_selectors
from marketplace.amounts import usd, usd_per_hour
from marketplace.models import ResaleListing, Reservation
from marketplace.money import ledger
from marketplace.products import reservations as reservation_services, resale as resale_services
from nodeagent.hardware.gpus import name_of
from scheduler.errors import DomainError

from ..forms import ListForResaleForm, ResaleFilterForm
from .common import Confirm, add_domain_error, confirm_page, mark_invalid, when

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
            "starts_at": max(r.starts_at, now + timedelta(minutes=5)), "ends_at": r.ends_at})
        rows.append({"r": r, "cap": resale_services.resale_cap(reservation=r) if r.state in Reservation.LIVE_STATES
                     else None, "form": form, "listings": list(r.listings.all()),
                     "cancel": reservation_services.cancel_terms(reservation=r, now=now)
                     if r.state in Reservation.LIVE_STATES else None,
                     "listable": r.state in Reservation.LIVE_STATES and r.ends_at > now})
    mine = market_selectors.listing_list(include_closed=True).filter(seller=request.user).order_by("-created_at")[:100]
    return render(request, "console/reservations.html", {
        "rows": rows, "my_listings": mine, "calendar": _calendar(reservations, now), "nav": "reservations",
        "cancel_policy": reservation_services.cancel_policy(),
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
            messages.success(request, f"Listed {when(listing.starts_at)}–{listing.ends_at:%H:%M} UTC at "
                                      f"{usd_per_hour(listing.ask_per_hour)} on the resale market.")
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
@require_http_methods(["GET", "POST"])
def resale_buy(request, listing_id):
    """Buy a listed window: the page asks first (GET), the purchase is one POST."""
    if request.method == "GET":
        listing = market_selectors.listing_list(include_closed=True).filter(pk=listing_id).first()
        if listing is None:
            raise Http404("no such listing")
        balance = ledger.wallet_balance(user=request.user)
        refused = ("This is your own listing." if listing.seller_id == request.user.pk else
                   "" if listing.state == ResaleListing.State.OPEN and listing.starts_at > timezone.now() else
                   "This window is no longer for sale.")
        if not refused and balance < listing.price_total:
            refused = f"Your wallet ({usd(balance)}) does not cover {usd(listing.price_total)}: top it up first."
        return confirm_page(request, Confirm(
            title=f"Buy {name_of(listing.gpu_model)} {listing.profile} in {listing.region} for "
                  f"{usd(listing.price_total)}?",
            points=[f"The window {when(listing.starts_at)}–{listing.ends_at:%H:%M} UTC becomes your reservation "
                    f"({usd_per_hour(listing.ask_per_hour)}); it starts on its own.",
                    f"{usd(listing.price_total)} is paid from your wallet now ({usd(balance)} now, "
                    f"{usd(balance - listing.price_total)} after).",
                    "A purchase is final: a window bought here is not cancelled, but you can list it for resale."],
            action=f"Buy for {usd(listing.price_total)}", keep="Don't buy", back=reverse("console:resale"),
            refused=refused))
    try:
        purchase = resale_services.listing_purchase(buyer=request.user, listing_id=listing_id)
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect("console:resale")
    r = purchase.reservation
    messages.success(request, f"Bought: {when(r.starts_at)}–{r.ends_at:%H:%M} UTC is yours "
                              f"({usd(purchase.listing.price_total)} paid).")
    return redirect("console:reservations")


@login_required
@require_http_methods(["GET", "POST"])
def reservation_cancel(request, reservation_id):
    """Cancel a booked window by the cancel policy: the page says what comes back first (GET)."""
    r = market_selectors.reservation_list(user=request.user).filter(pk=reservation_id).first()
    if r is None:
        raise Http404("no such reservation among yours")
    if request.method == "GET":
        terms = reservation_services.cancel_terms(reservation=r)
        return confirm_page(request, Confirm(
            title=f"Cancel your reservation {when(r.starts_at)}–{r.ends_at:%H:%M} UTC?",
            points=[f"{r.gpu.gpu_model.name if r.gpu.gpu_model else r.gpu.name} {r.profile or 'whole GPU'} in "
                    f"{r.gpu.node.region}, paid {usd(r.price_total)}.",
                    f"You get {usd(terms.refund)} back to your wallet: {terms.why}." if not terms.refused else "",
                    "Its capacity goes back on the market and its open resale listings are withdrawn; a cancelled "
                    "window cannot be booked back as it was."],
            action=f"Cancel it and refund {usd(terms.refund)}", keep="Keep the reservation",
            back=reverse("console:reservations"), refused=terms.refused))
    try:
        _, terms = reservation_services.reservation_cancel(holder=request.user, reservation_id=r.pk)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"The reservation is cancelled: {usd(terms.refund)} is back in your wallet.")
    return redirect("console:reservations")
