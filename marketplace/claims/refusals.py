"""Why an order cannot be placed, in the buyer's words: the one phrasing of the engine's refusals, read by the
order's refusal (API and console), a queued order's explanation and the console's price preview.

The engine counts the GPUs each filter refused, in its own words ("10 GPUs: 8 spot price over bid 0.2/h, 2 region
not allowed"). A buyer wants to know what is missing and what to change: "No H100-80GB slice with 10 GB is free in
eu-west under your bid of $0.2000/h." GPUs outside the order (another model or region) are not the buyer's
business; the rest are grouped by what would help: a higher bid, another time, another unit.
"""
from __future__ import annotations

from decimal import Decimal

from marketplace.amounts import usd_per_hour
from nodeagent.hardware.gpus import name_of
from scheduler.core.model import Request

# The engine's reasons (scheduler.core.filters, scheduler.core.pool.slice_for) by the start of their wording.
OUTSIDE = ("wrong model", "region not allowed")
GROUPS = (
    ("price", ("spot price over bid", "price over cap")),
    ("taken", ("GPU busy", "no legal placement", "fewer than")),
    ("down", ("node offline", "cordoned", "degraded")),
    ("fit", ("needs ", "no slice with", "no ")),  # after "no legal placement": the slice does not exist there
    ("software", ("cuda", "compute capability")),
    ("containers", ("node runs no containers",)),
    ("image", ("image not allowed",)),
)
SAID = {"price": "priced above it", "taken": "fully taken", "down": "offline or out of service",
        "fit": "without such a slice", "software": "too old a CUDA or GPU for the order",
        "containers": "without containers (its server runs none)", "image": "closed to your image by its provider"}


def refusal_group(reason: str) -> str | None:
    """The group of GROUPS one of the engine's reasons is in ("price", "taken", ...; "other" when none), None for a
    GPU outside the order (another model or region)."""
    if reason.startswith(OUTSIDE):
        return None
    for name, starts in GROUPS:
        if reason.startswith(starts):
            return name
    return "other"


def model_names(keys) -> str:
    """Catalog keys as the catalog names them: "H100-80GB", "A100-80GB or H100-80GB"."""
    names = sorted(name_of(k) for k in keys)
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 2 else names)


def unit_words(request: Request) -> str:
    """What the order asks for: "H100-80GB slice with 10 GB", "whole L4", "2 whole GPUs"."""
    models = model_names(request.models) if request.models else ""
    if request.gpu_count > 1:
        return f"{request.gpu_count} whole {models + ' ' if models else ''}GPUs"
    if request.whole_gpu:
        return f"whole {models or 'GPU'}"
    if request.profile:
        return f"{models + ' ' if models else ''}{request.profile} slice"
    size = f" with {request.memory_gb:g} GB" if request.memory_gb else ""
    return f"{models + ' ' if models else 'GPU '}slice{size}"


def refusal(*, request: Request, reasons: dict[str, int]) -> str:
    """One sentence a buyer reads when nothing fits `request`; `reasons` are the engine's counts per reason."""
    what = unit_words(request)
    where = f" in {', '.join(sorted(request.regions))}" if request.regions else ""
    # k GPUs must sit on one node: say so in the subject ("No node has 2 whole L4 GPUs free").
    none_free = (f"No node has {what} free{where}" if request.gpu_count > 1 else f"No {what} is free{where}")
    counts: dict[str, int] = {}
    for reason, n in reasons.items():
        group = refusal_group(reason)
        if group is not None:
            counts[group] = counts.get(group, 0) + n
    if not counts:
        return (f"No node{where} offers {what}." if request.gpu_count > 1
                else f"No {what}{where} is offered on the market.")
    cap = request.max_price_per_hour
    if "price" in counts and cap is not None:
        limit = usd_per_hour(Decimal(str(cap)))
        head = f"{none_free} under your bid of {limit}" if request.mode == "spot" else \
            f"{none_free} at or under your price cap of {limit}"
    else:
        head = f"{none_free} {'for your whole window' if request.mode == 'reserved' else 'right now'}"
    total, there = sum(counts.values()), " there" if where else ""
    if len(counts) == 1:
        (group, n), = counts.items()
        return f"{head}: {'the one GPU' if n == 1 else f'all {n} GPUs'}{there} {'is' if n == 1 else 'are'} " \
               f"{SAID.get(group, 'unavailable')}."
    parts = [f"{n} {'is' if n == 1 else 'are'} {SAID.get(g, 'unavailable')}" for g, n in
             sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return f"{head}: of {total} GPUs{there}, {', '.join(parts[:-1])} and {parts[-1]}."
