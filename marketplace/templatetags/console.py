"""Template helpers of the console: the menu, money and time formatting."""
from __future__ import annotations

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from marketplace import amounts
from marketplace.products.alerts import alerts_firing_count
from nodeagent.hardware.gpus import name_of

register = template.Library()

NAV = [("catalog", "Catalog", "console:catalog"), ("leases", "My leases", "console:leases"),
       ("reservations", "Reservations", "console:reservations"), ("resale", "Resale", "console:resale"),
       ("billing", "Billing", "console:billing"), ("operations", "Operations", "console:operations"),
       ("tco", "TCO", "console:tco"), ("nodes", "My nodes", "console:nodes"),
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


@register.simple_tag
def firing_alerts(user=None) -> int:
    """How many of the user's alerts are firing: the bell's number (one query a page)."""
    return alerts_firing_count(user=user) if user is not None and user.is_authenticated else 0


@register.filter
def usd(value, places: int = 2) -> str:
    """An amount as dollars, the one way the console writes money (marketplace.amounts.usd)."""
    return amounts.usd(value, places)


@register.filter
def per_hour(value) -> str:
    """A price per hour: "$0.6943/h"."""
    return amounts.usd_per_hour(value) if value not in (None, "") else "—"


@register.filter
def duration(seconds) -> str:
    """Seconds as a time span (a job's run, GPU time on a statement): 42 s, 3 min 05 s, 2 h 04 min."""
    try:
        s = int(seconds)
    except (TypeError, ValueError):
        return "—"
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


@register.filter(name="hours")
def gpu_hours(seconds) -> str:
    """GPU time, written as `duration` writes it (a 75-second lease is "1 min 15 s", not "1 min" or "0.02 h")."""
    return duration(seconds)


@register.filter
def gpu_name(key) -> str:
    """A GPU model's catalog key as its name: h100-80gb -> H100-80GB (the console shows names, URLs keep keys)."""
    return name_of(str(key)) if key else "—"


PU_HELP = ("Performance units: one normalised measure of what a slice delivers (from its model's compute, memory "
           "and bandwidth and its share of the GPU), so prices compare across models")
MEDIA_HELP = ("+me: the slice has the GPU's media engines (video decoders, JPEG decoder, optical flow); only one slice "
              "per GPU can have them")


@register.simple_tag
def pu_help() -> str:
    return PU_HELP


@register.filter
def profile_name(profile) -> str:
    """A MIG profile as the console shows it: "whole" as "whole GPU", "+me" explained on hover."""
    profile = str(profile or "")
    if profile in ("", "whole"):
        return "whole GPU"
    if profile.endswith("+me"):
        return format_html('{}<abbr title="{}">+me</abbr>', profile[:-3], MEDIA_HELP)
    return profile


# Why a lease ended, as its buyer reads it (the lifecycle records short reasons: marketplace/lifecycle/leases.py).
END_REASONS = {"insufficient_funds": "the wallet ran out of money",
               "budget_cap": "its project reached its monthly budget (a hard cap)", "duration over": "its duration was over",
               "window over": "its reserved window was over", "interrupted": "interrupted (spot)",
               "ended by the buyer": "you ended it", "cancelled by the buyer": "you cancelled its order",
               "node offline": "its node went offline", "instance destroyed": "its slice was destroyed"}


@register.filter
def end_reason(reason) -> str:
    return END_REASONS.get(str(reason or ""), str(reason or ""))
