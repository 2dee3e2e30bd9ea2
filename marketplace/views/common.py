"""Helpers shared by the console views: forms that show errors beside their fields, domain errors on forms, the
month a page shows, the confirmation every destructive action asks for."""
from __future__ import annotations

from dataclasses import dataclass, field

from django import forms
from django.shortcuts import render

from marketplace.money.statements import month_bounds
from scheduler.errors import DomainError


def mark_invalid(form: forms.BaseForm) -> None:
    """Mark each invalid field for screen readers. Django (5.x) renders aria-invalid and points
    aria-describedby at "<id>_error" and "<id>_helptext", the ids templates/console/_field.html uses."""
    for name, form_field in form.fields.items():
        if form.errors.get(name):
            form_field.widget.attrs["aria-invalid"] = "true"


def add_domain_error(form: forms.BaseForm, exc: DomainError, *, fields: dict | None = None) -> None:
    """Put a service's error beside the field it names (mapped through `fields`), else above the form."""
    name = (fields or {}).get(exc.field, exc.field)
    form.add_error(name if name in form.fields else None, exc.message)
    mark_invalid(form)


def when(moment) -> str:
    """A moment as the console's messages write it, in UTC, 24-hour: "Wed Dec 2 07:00"."""
    return f"{moment:%a %b} {moment.day} {moment:%H:%M}"


def is_htmx(request) -> bool:
    return request.headers.get("HX-Request") == "true"


def month_param(request) -> str:
    """The page's ?month=YYYY-MM, or this month when it is missing or malformed."""
    try:
        return month_bounds(request.GET.get("month") or None)[0]
    except DomainError:
        return month_bounds(None)[0]


@dataclass
class Confirm:
    """A destructive action's question: `title` ("End lease 4e6243f6?"), what it does (`points`, in the person's
    words), the button (`action`), the way out (`keep`, back to `back`), hidden `fields` posted with it; `refused`:
    why it cannot be done (the page then only offers the way out)."""

    title: str
    points: list[str]
    action: str
    back: str
    keep: str = "Cancel"
    fields: dict = field(default_factory=dict)
    refused: str = ""


def confirm_page(request, confirm: Confirm):
    """The confirmation page (templates/console/confirm.html): GET on a destructive action's address shows it,
    changing nothing; its button POSTs to the same address, where the view acts."""
    confirm.points = [p for p in confirm.points if p]
    return render(request, "console/confirm.html", {"confirm": confirm}, status=409 if confirm.refused else 200)
