"""The order page: one form for the four modes, a live price preview (htmx partial), the wallet balance,
errors beside their fields, and a calendar of free reserved windows. Orders go through
marketplace.services.orders.order_place, the same service the API calls."""
from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.utils import timezone

from marketplace.models import Lease, Mode, Reservation, ResaleListing
from marketplace.selectors import market as market_selectors
from marketplace.selectors.catalog import Filters, offer_list
from marketplace.services import ledger
from marketplace.services import orders as order_services
from marketplace.services.capacity import market
from scheduler.core import mig as core_mig
from scheduler.errors import DomainError
from scheduler.models import Gpu, Node, Slice

from ..forms import OrderForm
from .common import add_domain_error, is_htmx, mark_invalid

# The service's field names -> this form's.
FIELDS = {"gpu_models": "gpu_model", "regions": "region", "duration_seconds": "duration_hours",
          "listing": "listing", "window_start": "window_start", "window_end": "window_end",
          "max_price_per_hour": "max_price_per_hour", "memory_gb": "memory_gb", "compute_slices": "compute_slices",
          "gpu_count": "gpu_count",
          "mode": "mode", "if_unavailable": "if_unavailable", "starts_at": "listing", "webhook_url": "webhook_url"}
CALENDAR_DAYS = 7


def _compute_of(profile: str) -> int:
    try:
        return int(profile.split("g.")[0])
    except ValueError:
        return 99  # whole GPU: more than any slice


def _value(form: OrderForm, name: str):
    """A field's cleaned value when valid, else None (the preview works from whatever is valid)."""
    return form.cleaned_data.get(name) if hasattr(form, "cleaned_data") else None


def quote(form: OrderForm, *, now: datetime | None = None) -> dict | None:
    """What this order would cost now: the cheapest unit that fits, per hour, total and per PU-hour."""
    now = now or timezone.now()
    mode = _value(form, "mode") or "on_demand"
    if mode == Mode.RESALE:
        listing_id = _value(form, "listing")
        listing = ResaleListing.objects.filter(pk=listing_id).first() if listing_id else None
        if listing is None:
            return None
        hours = Decimal(str((listing.ends_at - listing.starts_at).total_seconds() / 3600))
        return {"mode": mode, "unit": f"{listing.gpu_model} {listing.profile}", "region": listing.region,
                "per_hour": listing.ask_per_hour, "hours": hours, "total": listing.price_total, "per_pu_hour": None,
                "available": listing.state == ResaleListing.State.OPEN}
    price_key = mode
    hours = _value(form, "duration_hours")
    if mode == Mode.RESERVED:
        start, end = _value(form, "window_start"), _value(form, "window_end")
        if not start or not end or end <= start:
            hours = None
        else:
            hours = Decimal(str((end - start).total_seconds() / 3600))
            if (start - now).total_seconds() < market("RESERVED_AHEAD_SECONDS"):
                price_key = "reserved_short_notice"
    offer = best_offer(form, price_key=price_key)
    if offer is None:
        return {"mode": mode, "none": True}
    per_hour = offer.price(price_key)
    total = (per_hour * hours).quantize(Decimal("0.01")) if hours else None
    bid = _value(form, "max_price_per_hour")
    return {"mode": mode, "unit": f"{offer.gpu_model} {offer.profile}", "region": offer.region, "offer": offer,
            "per_hour": per_hour, "hours": hours, "total": total, "pu": offer.pu,
            "per_pu_hour": (per_hour / Decimal(str(offer.pu))).quantize(Decimal("0.0001")) if offer.pu else None,
            "available": offer.availability > 0, "short_notice": price_key == "reserved_short_notice",
            "bid_too_low": mode == Mode.SPOT and bid is not None and bid < per_hour,
            "first_charge": (per_hour * Decimal(str(market("MIN_PREPAID_SECONDS"))) / 3600).quantize(Decimal("0.01"))}


def best_offer(form: OrderForm, *, price_key: str):
    whole = bool(_value(form, "whole_gpu"))
    memory = _value(form, "memory_gb") or 0
    compute = _value(form, "compute_slices") or 1
    offers = offer_list(filters=Filters(gpu_model=_value(form, "gpu_model") or None, min_memory_gb=memory or None,
                                        region=_value(form, "region") or None, mode=price_key, ordering="price"))
    if whole:
        # A whole GPU: a non-MIG unit, or a MIG GPU's full profile (the most memory of its model).
        full = {}
        for o in offers:
            full[o.gpu_model] = max(full.get(o.gpu_model, 0), o.memory_gb)
        fits = [o for o in offers if o.profile == "whole" or o.memory_gb >= full[o.gpu_model]]
    else:
        fits = [o for o in offers if o.profile != "whole" and _compute_of(o.profile) >= compute]
    # The scheduler takes the smallest slice that fits; among those, the cheapest with room now.
    fits.sort(key=lambda o: (o.availability <= 0, o.memory_gb, o.price(price_key) or 0, "+me" in o.profile))
    return fits[0] if fits else None


def free_calendar(*, offer, now: datetime | None = None) -> dict:
    """Hour by hour over the next days: can `offer`'s slice be reserved then? Counts the unit's GPUs, the
    live reservations and the open non-spot leases on them (a few queries, whatever the span)."""
    now = now or timezone.now()
    first = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    last = first + timedelta(days=CALENDAR_DAYS)
    gpus = list(Gpu.objects.filter(present=True, gpu_model__key=offer.gpu_model, node__region=offer.region,
                                   node__status=Node.Status.ONLINE).exclude(health=Gpu.Health.CORDONED))
    by_gpu = {g.pk: g for g in gpus}
    holds: dict[int, list[tuple[str, int, datetime, datetime]]] = {g.pk: [] for g in gpus}
    for gpu_id, profile, start, s, e in Reservation.objects.filter(
            gpu_id__in=by_gpu, state__in=Reservation.LIVE_STATES, starts_at__lt=last, ends_at__gt=first
    ).values_list("gpu_id", "profile", "slot_start", "starts_at", "ends_at"):
        holds[gpu_id].append((profile, start, s, e))
    for gpu_id, profile, start, ends in Slice.objects.filter(
            gpu_id__in=by_gpu, state__in=Slice.ACTIVE_STATES).exclude(
            lease__mode=Mode.SPOT).exclude(lease__state__in=[Lease.State.ENDING, Lease.State.INTERRUPTING]
                                           ).values_list("gpu_id", "profile", "start", "lease__ends_at"):
        holds[gpu_id].append((profile, start or 0, now, ends or last))
    profile = None if offer.profile == "whole" else offer.profile

    def free_at(t0: datetime, t1: datetime) -> bool:
        for gpu in gpus:
            busy = [(p, s) for p, s, a, b in holds[gpu.pk] if a < t1 and b > t0]
            geometry = gpu.geometry()
            if geometry is None or profile is None:
                if not busy:
                    return True
                continue
            if core_mig.legal_starts(geometry, [core_mig.Instance(p or geometry.full_profile.name, s)
                                                for p, s in busy], profile):
                return True
        return False

    day0 = datetime.combine(first.date(), datetime.min.time(), tzinfo=first.tzinfo)
    days = [day0 + timedelta(days=d) for d in range(CALENDAR_DAYS)]
    rows = []
    for h in range(24):
        cells = []
        for day in days:
            t0 = day + timedelta(hours=h)
            t1 = t0 + timedelta(hours=1)
            cells.append({"start": t0, "end": t1,
                          "state": "past" if t0 < first else ("free" if free_at(t0, t1) else "busy")})
        rows.append({"hour": h, "cells": cells})
    return {"days": days, "rows": rows, "unit": offer, "gpus": len(gpus)}


def _spec(form: OrderForm) -> order_services.OrderSpec:
    d = form.cleaned_data
    mode = d["mode"]
    hours = d.get("duration_hours")
    return order_services.OrderSpec(
        mode=mode, gpu_models=[d["gpu_model"]] if d.get("gpu_model") else [],
        memory_gb=float(d.get("memory_gb") or 0), compute_slices=d.get("compute_slices") or 1,
        whole_gpu=bool(d.get("whole_gpu")),
        gpu_count=(d.get("gpu_count") or 1) if mode in (Mode.ON_DEMAND, Mode.SPOT) else 1,
        regions=[d["region"]] if d.get("region") else [],
        duration_seconds=int(hours * 3600) if hours and mode in (Mode.ON_DEMAND, Mode.SPOT) else None,
        window_start=d.get("window_start") if mode == Mode.RESERVED else None,
        window_end=d.get("window_end") if mode == Mode.RESERVED else None,
        max_price_per_hour=d.get("max_price_per_hour"), if_unavailable=d.get("if_unavailable") or "fail",
        webhook_url=d.get("webhook_url") or "",
        listing_id=d.get("listing") if mode == Mode.RESALE else None, project_id=d.get("project") or None)


def _context(request, form: OrderForm, *, priced: OrderForm | None = None) -> dict:
    """`priced` is the bound form the preview is computed from (the shown form itself when bound)."""
    priced = priced if priced is not None else form
    q = None
    if priced.is_bound:
        priced.is_valid()  # the preview prices whatever fields are valid so far
        q = quote(priced)
    calendar = None
    if q and q.get("offer") is not None and (_value(priced, "mode") or "on_demand") == Mode.RESERVED:
        calendar = free_calendar(offer=q["offer"])
    return {"form": form, "quote": q, "calendar": calendar, "balance": ledger.wallet_balance(user=request.user),
            "listings": market_selectors.listing_list().exclude(seller=request.user)[:50], "nav": "catalog"}


@login_required
def order(request):
    if request.method == "POST":
        form = OrderForm(request.POST, user=request.user)
        if form.is_valid():
            try:
                placed = order_services.order_place(buyer=request.user, spec=_spec(form))
            except DomainError as exc:
                add_domain_error(form, exc, fields=FIELDS)
            else:
                return _after_order(request, placed)
        mark_invalid(form)
        return render(request, "console/order.html", _context(request, form), status=400)
    # A link from the catalog prefills the form (unbound: no errors shown) and prices it at once.
    initial = {**{k: v for k, v in OrderForm().initial.items()}, **request.GET.dict()}
    defaults = {"mode": "on_demand", "memory_gb": "10", "compute_slices": "1", "duration_hours": "1",
                "if_unavailable": "fail"}
    return render(request, "console/order.html",
                  _context(request, OrderForm(initial=initial, user=request.user),
                           priced=OrderForm({**defaults, **request.GET.dict()}, user=request.user)))


def _after_order(request, placed):
    if placed.state == placed.State.QUEUED:
        messages.info(request, f"Your order waits for capacity: {placed.explain or 'nothing fits right now'}.")
        return redirect("console:leases")
    if placed.mode in (Mode.RESERVED, Mode.RESALE):
        messages.success(request, "Reserved: the window is yours and paid; it starts on its own.")
        return redirect("console:reservations")
    lease = placed.leases.order_by("-created_at").first()
    messages.success(request, "Ordered: your slice is being carved; it runs in a few seconds.")
    return redirect("console:lease", lease_id=lease.pk) if lease else redirect("console:leases")


@login_required
def order_preview(request):
    """The live price preview and (for reserved) the free-window calendar, as an htmx partial."""
    form = OrderForm(request.GET, user=request.user)
    form.is_valid()
    return render(request, "console/_order_preview.html", _context(request, form))
