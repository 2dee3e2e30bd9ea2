"""Helpers shared by the console views: forms that show errors beside their fields, domain errors on forms, the
month a page shows."""
from __future__ import annotations

from django import forms

from marketplace.money.statements import month_bounds
from scheduler.errors import DomainError


def mark_invalid(form: forms.BaseForm) -> None:
    """Mark each invalid field for screen readers. Django (5.x) renders aria-invalid and points
    aria-describedby at "<id>_error" and "<id>_helptext", the ids templates/console/_field.html uses."""
    for name, field in form.fields.items():
        if form.errors.get(name):
            field.widget.attrs["aria-invalid"] = "true"


def add_domain_error(form: forms.BaseForm, exc: DomainError, *, fields: dict | None = None) -> None:
    """Put a service's error beside the field it names (mapped through `fields`), else above the form."""
    name = (fields or {}).get(exc.field, exc.field)
    form.add_error(name if name in form.fields else None, exc.message)
    mark_invalid(form)


def is_htmx(request) -> bool:
    return request.headers.get("HX-Request") == "true"


def month_param(request) -> str:
    """The page's ?month=YYYY-MM, or this month when it is missing or malformed."""
    try:
        return month_bounds(request.GET.get("month") or None)[0]
    except DomainError:
        return month_bounds(None)[0]
