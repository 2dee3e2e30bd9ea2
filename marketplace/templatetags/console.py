"""Template helpers of the console: the menu, money and time formatting."""
from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django import template
from django.urls import NoReverseMatch, reverse

register = template.Library()

NAV = [("catalog", "Catalog", "console:catalog"), ("leases", "My leases", "console:leases"),
       ("reservations", "Reservations", "console:reservations"), ("resale", "Resale", "console:resale"),
       ("billing", "Billing", "console:billing"), ("nodes", "My nodes", "console:nodes"),
       ("earnings", "Earnings", "console:earnings"),
       ("register", "Register a node", "console:node-register"), ("account", "Account", "console:account")]

PUBLIC = {"catalog", "resale"}


@register.simple_tag
def console_nav(user=None) -> list[dict]:
    """The menu, one list for every page; a visitor sees the public pages; a page not wired yet is left out."""
    items = []
    for key, label, name in NAV:
        if not (user is not None and user.is_authenticated) and key not in PUBLIC:
            continue
        try:
            items.append({"key": key, "label": label, "url": reverse(name)})
        except NoReverseMatch:
            continue
    return items


@register.filter
def usd(value, places: int = 2) -> str:
    """A Decimal amount as dollars, rounded half-up: 1234.5 -> $1,234.50."""
    if value in (None, ""):
        return "—"
    try:
        d = Decimal(str(value)).quantize(Decimal(1).scaleb(-int(places)), rounding=ROUND_HALF_UP)
    except (InvalidOperation, ValueError):
        return str(value)
    sign = "−" if d < 0 else ""
    return f"{sign}${abs(d):,.{int(places)}f}"


@register.filter
def hours(seconds) -> str:
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return "—"
    return f"{s / 3600:.2f} h" if s >= 360 else f"{s / 60:.0f} min"


@register.filter
def duration(seconds) -> str:
    """Seconds as a job's running time: 42 s, 3 min 05 s, 2 h 04 min."""
    try:
        s = int(seconds)
    except (TypeError, ValueError):
        return "—"
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
