"""Helpers shared by the console views: forms that show errors beside their fields, domain errors on forms."""
from __future__ import annotations

from django import forms

from scheduler.errors import DomainError


def mark_invalid(form: forms.BaseForm) -> None:
    """Point each invalid field at its message (aria-invalid, aria-describedby) for screen readers."""
    for name, field in form.fields.items():
        if form.errors.get(name):
            field.widget.attrs.update({"aria-invalid": "true", "aria-describedby": f"{form[name].id_for_label}-error"})


def add_domain_error(form: forms.BaseForm, exc: DomainError, *, fields: dict | None = None) -> None:
    """Put a service's error beside the field it names (mapped through `fields`), else above the form."""
    name = (fields or {}).get(exc.field, exc.field)
    form.add_error(name if name in form.fields else None, exc.message)
    mark_invalid(form)


def is_htmx(request) -> bool:
    return request.headers.get("HX-Request") == "true"
