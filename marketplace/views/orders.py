"""The order page: one form for the four modes, a live price preview (htmx partial), the wallet balance,
errors beside their fields, and a calendar of free reserved windows. Orders go through
marketplace.products.orders.order_place, the same service the API calls; the preview asks order_quote,
the same engine on a shared snapshot."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.utils import timezone

from marketplace import selectors as market_selectors
from marketplace.models import Mode
from marketplace.money import ledger
from marketplace.products import orders as order_services, reservations as reservation_services
from marketplace.products.workloads import WorkloadSpec
from scheduler.errors import DomainError

from ..forms import OrderForm, workload_choices
from .common import add_domain_error, mark_invalid

# The service's field names -> this form's.
FIELDS = {"gpu_models": "gpu_model", "regions": "region", "duration_seconds": "duration_hours",
          "listing": "listing", "window_start": "window_start", "window_end": "window_end",
          "max_price_per_hour": "max_price_per_hour", "memory_gb": "memory_gb", "compute_slices": "compute_slices",
          "gpu_count": "gpu_count",
          "mode": "mode", "if_unavailable": "if_unavailable", "starts_at": "listing", "webhook_url": "webhook_url",
          "workload.template": "workload", "workload.image": "image", "workload.args": "command",
          "workload.command": "command", "workload.env": "env", "workload.ports": "ports",
          "workload.disk_gb": "disk_gb", "workload.kind": "kind", "workload.notice": "notice"}


def _value(form: OrderForm, name: str):
    """A field's cleaned value when valid, else None (the preview works from whatever is valid)."""
    return form.cleaned_data.get(name) if hasattr(form, "cleaned_data") else None


def quote(form: OrderForm, *, user, now: datetime | None = None):
    """What this order would be given now (products.orders.order_quote), from the fields valid so far."""
    mode = _value(form, "mode") or "on_demand"
    data = {name: _value(form, name) for name in form.fields}
    data["mode"] = mode
    window_chosen = bool(data.get("window_start") and data.get("window_end"))
    if mode == Mode.RESERVED and not window_chosen:
        # No window yet: price the unit an hour-long window booked ahead would get, so that the calendar of
        # free hours can be drawn for it (the window is then picked there).
        start = (now or timezone.now()).replace(minute=0, second=0, microsecond=0) + timedelta(hours=2)
        data["window_start"], data["window_end"] = start, start + timedelta(hours=1)
    try:
        q = order_services.order_quote(buyer=user, spec=_spec_from(data), now=now)
    except DomainError:
        return None
    if mode == Mode.RESERVED and not window_chosen:
        q.hours = q.total = None
    return q


def _spec(form: OrderForm) -> order_services.OrderSpec:
    return _spec_from(form.cleaned_data)


def _spec_from(d: dict) -> order_services.OrderSpec:
    mode = d["mode"]
    hours = d.get("duration_hours")
    gpu_count = (d.get("gpu_count") or 1) if mode in (Mode.ON_DEMAND, Mode.SPOT) else 1
    return order_services.OrderSpec(
        mode=mode, gpu_models=[d["gpu_model"]] if d.get("gpu_model") else [],
        memory_gb=float(d.get("memory_gb") or 0),
        # The form's "GPUs" field asks for whole GPUs: its slice fields do not apply then.
        compute_slices=(d.get("compute_slices") or 1) if gpu_count == 1 else None,
        whole_gpu=bool(d.get("whole_gpu")) or gpu_count > 1, gpu_count=gpu_count,
        regions=[d["region"]] if d.get("region") else [],
        duration_seconds=int(hours * 3600) if hours and mode in (Mode.ON_DEMAND, Mode.SPOT) else None,
        window_start=d.get("window_start") if mode == Mode.RESERVED else None,
        window_end=d.get("window_end") if mode == Mode.RESERVED else None,
        max_price_per_hour=d.get("max_price_per_hour"), if_unavailable=d.get("if_unavailable") or "fail",
        webhook_url=d.get("webhook_url") or "",
        listing_id=d.get("listing") if mode == Mode.RESALE else None, project_id=d.get("project") or None,
        workload=_workload_from(d))


def _workload_from(d: dict) -> WorkloadSpec | None:
    """The form's workload fields as a WorkloadSpec (None: "nothing, the slice only")."""
    choice = d.get("workload") or "none"
    if choice == "none":
        return None
    env = [{"name": k, "value": v} for k, v in d.get("env_pairs") or []]
    env += [{"name": k, "value": v, "secret": True} for k, v in d.get("secret_env_pairs") or []]
    return WorkloadSpec(template=None if choice == "image" else choice, image=(d.get("image") or "").strip(),
                        args=d.get("command_args") or [], env=env, ports=d.get("port_list") or [],
                        disk_gb=d.get("disk_gb"), kind=d.get("kind") or None, notice=d.get("notice") or "sigterm")


def _context(request, form: OrderForm, *, priced: OrderForm | None = None) -> dict:
    """`priced` is the bound form the preview is computed from (the shown form itself when bound)."""
    priced = priced if priced is not None else form
    q = None
    if priced.is_bound:
        priced.is_valid()  # the preview prices whatever fields are valid so far
        q = quote(priced, user=request.user)
    calendar, chosen = None, None
    if q is not None and q.available and q.mode == Mode.RESERVED:
        calendar = reservation_services.free_calendar(gpu_model=q.gpu_model, profile=None if q.profile == "whole"
                                                      else q.profile, region=q.region)
        # The window chosen so far is drawn by the server, so the preview's refresh keeps it highlighted.
        start, end = _value(priced, "window_start"), _value(priced, "window_end")
        if start and end and end > start:
            chosen = (start, end)
            for row in calendar["rows"]:
                for cell in row["cells"]:
                    cell["chosen"] = start <= cell["start"] and cell["end"] <= end
    return {"form": form, "quote": q, "calendar": calendar, "chosen_window": chosen,
            "balance": ledger.wallet_balance(user=request.user),
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
                "if_unavailable": "fail", "workload": workload_choices()[0][0], "kind": "interactive", "notice": "sigterm"}
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
    if getattr(placed, "workload", None) is not None:
        messages.success(request, "Ordered: your slice is being carved and your container pulled; the lease runs "
                                  "(and billing starts) when the container does.")
    else:
        messages.success(request, "Ordered: your slice is being carved; it runs in a few seconds.")
    return redirect("console:lease", lease_id=lease.pk) if lease else redirect("console:leases")


@login_required
def order_preview(request):
    """The live price preview and (for reserved) the free-window calendar, as an htmx partial."""
    form = OrderForm(request.GET, user=request.user)
    form.is_valid()
    return render(request, "console/_order_preview.html", _context(request, form))
