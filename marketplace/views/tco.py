"""The TCO calculator page: a form whose empty fields take the defaults (the catalog, the buyer's last 30 days of
leases), the cost of each way to run the plan as stacked bars and a table of its cost lines. A calculation: GET."""
from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from marketplace.products import tco as tco_services
from scheduler.errors import DomainError

from ..forms import TcoForm
from .common import mark_invalid

LABELS = {"buy": "Buy", "on_demand": "On demand", "reserved": "Reserved", "spot": "Spot", "mix": "Mix"}
LINE_LABELS = {"hardware": "hardware (written off)", "power": "power", "hosting": "hosting", "rent": "rent",
               "rework": "spot rework", "reserved": "reserved part", "spot": "spot part", "on_demand": "on-demand part"}


def _bars(options) -> list[dict]:
    """Each option's cost lines as segments of one bar, widths relative to the dearest option."""
    top = max((o.total for o in options), default=Decimal(0)) or Decimal(1)
    return [{"option": o, "label": LABELS[o.name], "cheapest": o.total == min(x.total for x in options),
             "segments": [{"name": k, "label": LINE_LABELS.get(k, k), "amount": v,
                           "width": float(v / top * 100)} for k, v in o.lines.items() if v > 0]}
            for o in options]


@login_required
def tco(request):
    form = TcoForm(request.GET or None)
    options, values, error = [], None, None
    if form.is_bound and not form.is_valid():
        mark_invalid(form)
    else:
        given = {k: v for k, v in (form.cleaned_data if form.is_bound else {}).items() if v not in (None, "")}
        try:
            values = {**tco_services.tco_defaults(buyer=request.user, gpu_model=given.get("gpu_model")), **given}
            _plan, options = tco_services.tco_for(values)
        except DomainError as exc:
            error = exc.message
            options = []
        if not form.is_bound:
            form = TcoForm(initial={k: v for k, v in values.items() if k in TcoForm.base_fields})
    return render(request, "console/tco.html", {"form": form, "bars": _bars(options) if options else [],
                                                "values": values, "error": error, "nav": "tco"},
                  status=400 if form.is_bound and form.errors else 200)
