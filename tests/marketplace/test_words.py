"""How people read the market: money written one way (marketplace.amounts.usd) and refusals in the buyer's words
(marketplace.claims.refusals). No database."""
from __future__ import annotations

from decimal import Decimal as D

import pytest

from marketplace.amounts import usd, usd_per_hour
from marketplace.claims.refusals import refusal
from scheduler.core.model import Request


@pytest.mark.parametrize("amount, places, shown", [
    ("1234.5", 2, "$1,234.50"),
    ("-0.2", 2, "−$0.20"),
    ("0.005", 2, "$0.01"),  # half-up, not to even
    ("0.015", 2, "$0.02"),
    ("0.0041", 2, "$0.0041"),  # a charge under half a cent never reads $0.00
    ("-0.004123", 2, "−$0.0041"),
    ("0.000049", 2, "$0.000049"),
    ("0", 2, "$0.00"),
    ("0.694286", 4, "$0.6943"),
    ("0.3855", 3, "$0.386"),
    (None, 2, "—"),
])
def test_money_is_written_to_the_cent_half_up_and_a_nonzero_amount_never_as_zero(amount, places, shown):
    assert usd(D(amount) if amount is not None else None, places) == shown


def test_a_price_per_hour_is_written_to_four_places():
    assert usd_per_hour(D("0.694286")) == "$0.6943/h"
    assert usd_per_hour(D("2")) == "$2.0000/h"


H100_EU = dict(models=frozenset({"h100-80gb"}), memory_gb=10, regions=frozenset({"eu-west"}))


@pytest.mark.parametrize("request_kw, reasons, said", [
    # the example: other regions are not the buyer's business, the bid is in the console's money
    (dict(H100_EU, mode="spot", max_price_per_hour=0.2), {"spot price over bid 0.2/h": 8, "region not allowed": 2},
     "No H100-80GB slice with 10 GB is free in eu-west under your bid of $0.2000/h: all 8 GPUs there are priced "
     "above it."),
    (dict(H100_EU, mode="spot", max_price_per_hour=0.2),
     {"spot price over bid 0.2/h": 6, "GPU busy": 1, "no legal placement": 1, "wrong model": 20},
     "No H100-80GB slice with 10 GB is free in eu-west under your bid of $0.2000/h: of 8 GPUs there, 6 are priced "
     "above it and 2 are fully taken."),
    (dict(H100_EU, max_price_per_hour=0.694286), {"price over cap 0.694286/h": 1},
     "No H100-80GB slice with 10 GB is free in eu-west at or under your price cap of $0.6943/h: the one GPU there "
     "is priced above it."),
    (dict(memory_gb=10), {"GPU busy": 3},
     "No GPU slice with 10 GB is free right now: all 3 GPUs are fully taken."),
    (dict(models=frozenset({"h100-80gb", "a100-80gb"}), whole_gpu=True), {"cordoned": 1, "GPU busy": 3},
     "No whole A100-80GB or H100-80GB is free right now: of 4 GPUs, 3 are fully taken and 1 is offline or out of "
     "service."),
    (dict(models=frozenset({"l4"}), gpu_count=2), {"fewer than 2 free GPUs on node": 3},
     "No node has 2 whole L4 GPUs free right now: all 3 GPUs are fully taken."),
    (dict(models=frozenset({"l4"}), gpu_count=2), {"wrong model": 3}, "No node offers 2 whole L4 GPUs."),
    (dict(H100_EU, mode="reserved"), {"no legal placement": 2},
     "No H100-80GB slice with 10 GB is free in eu-west for your whole window: all 2 GPUs there are fully taken."),
    (dict(H100_EU), {"region not allowed": 5}, "No H100-80GB slice with 10 GB in eu-west is offered on the market."),
    (dict(memory_gb=100), {"needs 100 GB per GPU": 4, "cuda 12.2 < required 12.4": 1},
     "No GPU slice with 100 GB is free right now: of 5 GPUs, 4 are without such a slice and 1 is too old a CUDA or "
     "GPU for the order."),
    ({}, {}, "No GPU slice is offered on the market."),
])
def test_a_refusal_says_what_is_missing_in_the_buyers_words(request_kw, reasons, said):
    text = refusal(request=Request(**request_kw), reasons=reasons)
    assert text == said
    # never the engine's own wording
    for internal in ("GPUs:", "over bid", "not allowed", "legal placement", "wrong model", "0.694286"):
        assert internal not in text
