"""The catalog: units (GPU model × slice × region) with every filter of the catalog selector, sorting,
prices per mode, $ per PU-hour, availability, reliability and interruption history; a unit's page with its
spot price chart. Public: visitors browse, buyers order."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone as dt_timezone

from django.http import Http404
from django.shortcuts import render
from django.utils import timezone

from marketplace import selectors as market_selectors
from marketplace.products.catalog import Filters, offer_list

from ..forms import CatalogFilterForm
from .common import is_htmx, mark_invalid

SPOT_HISTORY = timedelta(days=2)
PRICE_MODES = [("on_demand", "On demand"), ("reserved", "Reserved"), ("spot", "Spot"), ("resale", "Resale")]


def _filters(form: CatalogFilterForm) -> Filters:
    d = {k: v for k, v in form.cleaned_data.items() if v not in (None, "")}
    return Filters(gpu_model=d.get("gpu_model"), min_memory_gb=d.get("min_memory_gb"), min_cuda=d.get("min_cuda"),
                   min_compute_capability=d.get("min_compute_capability"), region=d.get("region"),
                   max_price=d.get("max_price"), min_reliability=d.get("min_reliability"),
                   mode=d.get("mode") or "on_demand", min_pu_per_dollar=d.get("min_pu_per_dollar"),
                   available_only=bool(d.get("available")), ordering=d.get("ordering") or "price")


def _rows(offers, mode: str) -> list[dict]:
    return [{"offer": o, "price": o.price(mode), "usd_per_pu_hour": o.usd_per_pu_hour(mode),
             "pu_per_dollar": o.pu_per_dollar(mode), "prices": [(m, label, o.price(m), o.usd_per_pu_hour(m)) for m, label in PRICE_MODES],
             "order_query": _order_query(o)} for o in offers]


def _order_query(o) -> str:
    from urllib.parse import urlencode

    q = {"gpu_model": o.gpu_model, "region": o.region}
    if o.compute_slices is None:
        q["whole_gpu"] = "on"
    else:
        q["memory_gb"] = f"{o.memory_gb:g}"
        q["compute_slices"] = str(o.compute_slices)
    return urlencode(q)


def catalog(request):
    form = CatalogFilterForm(request.GET or None)
    offers, mode = [], "on_demand"
    if form.is_bound and not form.is_valid():
        mark_invalid(form)
    else:
        if not form.is_bound:
            form.is_valid()  # an unbound form has no cleaned_data: use the defaults
            form.cleaned_data = {}
        filters = _filters(form)
        mode = filters.mode
        offers = offer_list(filters=filters)
    context = {"form": form, "rows": _rows(offers, mode), "mode": mode, "nav": "catalog",
               "mode_label": dict(CatalogFilterForm.base_fields["mode"].choices).get(mode, mode)}
    template = "console/_catalog_table.html" if is_htmx(request) else "console/catalog.html"
    return render(request, template, context, status=400 if form.errors else 200)


def unit_detail(request, key: str):
    try:
        gpu_model, profile, region = key.split(":")
    except ValueError:
        raise Http404("no such unit") from None
    offers = [o for o in offer_list(filters=Filters(gpu_model=gpu_model, region=region)) if o.profile == profile]
    if not offers:
        raise Http404("no such unit in the catalog now")
    offer = offers[0]
    now = timezone.now()
    since = now - SPOT_HISTORY
    series = {"t": [], "price": []}
    last = None
    # The spot price is a step function recorded every MARKET_SPOT_PRICE_SECONDS: its changes (and where the record
    # ends) draw it whole over the two days, however often it was recorded.
    points = (market_selectors.spot_price_series(gpu_model=gpu_model, since=since).order_by("at")
              .values_list("at", "factor"))
    for at, factor in points.iterator(chunk_size=2000):
        if factor != last:
            series["t"].append(int(at.timestamp()))
            series["price"].append(float(offer.price_at("spot", spot_factor=factor)))
            last = factor
    changes = max(0, len(series["t"]) - 1)
    if series["t"]:
        series["t"].append(int(now.timestamp()))
        series["price"].append(series["price"][-1])
        first = series["t"][0]
        series["span"] = [first, int(now.timestamp())]
    recorded_since = datetime.fromtimestamp(series["t"][0], tz=dt_timezone.utc) if series["t"] else None
    return render(request, "console/unit.html", {
        "offer": offer, "rows": _rows([offer], "on_demand"), "series": series, "changes": changes,
        "recorded_since": recorded_since, "full_history": recorded_since is not None and recorded_since <= since + timedelta(minutes=5),
        "order_query": _order_query(offer), "nav": "catalog"})
