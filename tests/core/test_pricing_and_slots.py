"""The one price rule (scheduler.core.pricing) and the one slots value (scheduler.core.slots), without a database."""
from __future__ import annotations

from decimal import Decimal as D

import pytest

from nodeagent.hardware import gpus
from scheduler.core.engine import Pool
from scheduler.core.pricing import PriceRules, share_decimal, slice_price, unit_price
from scheduler.core.slots import ALL_SLOTS, Slots
from tests.core.pools import gpu, node

A100 = gpus.GPU_MODELS["a100-80gb"].mig


@pytest.mark.parametrize("mode, free_share, expected", [
    ("on_demand", 1.0, D("3.600000")),  # 1.8 x base 2.00
    ("reserved", 1.0, D("1.700000")),  # 0.85 x base
    ("reserved_short_notice", 1.0, D("2.000000")),  # 1.0 x base
    ("spot", 1.0, D("1.000000")),  # 0.5 x base when the model's pool is all free
    ("spot", 0.5, D("1.200000")),  # 0.6
    ("spot", 0.0, D("1.400000")),  # 0.7 when full: still below reserved
])
def test_every_mode_is_priced_by_one_rule_on_base(mode, free_share, expected):
    assert unit_price(base_per_gpu_hour=D("2.00"), share=D(1), mode=mode, free_share=free_share) == expected
    assert slice_price(base_per_gpu_hour=2.0, share=1.0, mode=mode, free_share=free_share) == pytest.approx(
        float(expected))


def test_spot_is_the_cheapest_way_in_and_a_resale_ask_never_passes_base():
    rules = PriceRules()
    worst_spot = rules.factor("spot", free_share=0.0)
    assert worst_spot < rules.reserved < rules.reserved_short_notice < rules.on_demand
    assert rules.resale_cap < 1


def test_a_slice_costs_its_larger_share_of_compute_or_memory():
    assert share_decimal(geometry=A100, profile="3g.40gb") == D("0.5")  # 3/7 compute, 4/8 memory
    assert unit_price(base_per_gpu_hour=D("2.00"), share=share_decimal(geometry=A100, profile="1g.10gb"),
                      mode="on_demand") == D("0.514286")  # 1.8 x 2 / 7, half-up


@pytest.mark.parametrize("bad", [dict(spot_min=D("0.8"), spot_max=D("0.7")), dict(on_demand=D("-1")),
                                 dict(reserved=1.5)])
def test_price_rules_refuse_nonsense(bad):
    with pytest.raises(ValueError):
        PriceRules(**bad)


def test_the_engine_prices_spot_at_the_recorded_factor_of_the_model_else_by_its_free_share():
    pool = Pool([node("n", gpu("g0"), gpu("g1"), price=2.0)], spot_factors={"a100-80gb": D("0.65")})
    assert pool.price_per_hour(base_per_gpu_hour=2.0, share=1.0, mode="spot", model="a100-80gb") == pytest.approx(1.3)
    unrecorded = Pool([node("n", gpu("g0"), gpu("g1", instances=[("7g.80gb", 0)]), price=2.0)])
    assert unrecorded.price_per_hour(base_per_gpu_hour=2.0, share=1.0, mode="spot",
                                     model="a100-80gb") == pytest.approx(1.2)  # half free: 0.6 x base
    custom = Pool([node("n", gpu("g0"))], rules=PriceRules(on_demand=D("2")))
    assert custom.price_per_hour(base_per_gpu_hour=2.0, share=0.5, mode="on_demand", model="a100-80gb") == 2.0


@pytest.mark.parametrize("a, b, overlap", [
    (Slots(0, 4), Slots(4, 8), False),
    (Slots(0, 4), Slots(3, 5), True),
    (Slots(2, 3), Slots(0, 8), True),
    (Slots.whole(), Slots(7, 8), True),
    (Slots.whole(), Slots.whole(), True),
])
def test_slots_overlap_when_they_share_a_memory_slice(a, b, overlap):
    assert a.overlaps(b) is overlap and b.overlaps(a) is overlap


def test_slots_of_a_profile_a_whole_mig_gpu_and_a_gpu_that_is_not_split():
    assert Slots.of(A100, "3g.40gb", 4) == Slots(4, 8)
    assert Slots.of(A100, "1g.10gb", 6) == Slots(6, 7)
    assert Slots.of(None, None) == Slots.of(A100, None) == Slots(0, ALL_SLOTS)
    assert Slots.sized(0, 0) == Slots.whole() and Slots.sized(2, 2) == Slots(2, 4)
    with pytest.raises(ValueError):
        Slots(3, 3)


def test_a_request_can_pin_a_profile_the_smallest_fit_would_not_choose():
    from scheduler.core.engine import Scheduler
    from scheduler.core.model import Request

    pool = Pool([node("n", gpu("g0"))])
    d = Scheduler(pool).decide(Request(memory_gb=10, profile="2g.20gb"))
    assert d.ok and d.placements[0].profile == "2g.20gb"
    d = Scheduler(pool).decide(Request(profile="9g.99gb"))
    assert not d.ok and d.reasons == {"no 9g.99gb slice": 1}
