"""Best-fit's measure in the packing cost (fragmentation.FIT_WEIGHT, issue 12 §2 round two): a slice's cost is
Δfrag + FIT_WEIGHT × the share of the GPU left free after it, so when Δfrag ties the slice goes to the
tightest fit, as best-fit's would, and an empty GPU is opened only when Δfrag says it is worth it."""
from __future__ import annotations

import pytest

from nodeagent.hardware import mig
from scheduler.core import fragmentation as FR
from scheduler.core.engine import Pool, Scheduler
from scheduler.core.model import Request
from scheduler.core.weights import Weights

from .pools import gpu, node


@pytest.mark.parametrize("layout,expected", [
    ((), 1.0),
    ((("1g.10gb", 0),), 6 / 7),  # 7 of 8 memory slices but 6 of 7 compute slices left: the smaller counts
    ((("3g.40gb", 0),), 4 / 8),  # 4 memory slices, 4 of 7 compute slices
    ((("3g.40gb", 0), ("3g.40gb", 4)), 0.0),  # one compute slice left but no memory slice: nothing free
    ((("7g.80gb", 0),), 0.0),
])
def test_free_share_is_the_smaller_of_free_memory_and_free_compute(layout, expected):
    assert FR.free_share(mig.A100_80GB, layout) == pytest.approx(expected)


@pytest.mark.parametrize("profile,left", [("1g.10gb", 6 / 7), ("3g.40gb", 4 / 8), ("7g.80gb", 0.0)])
def test_on_an_empty_gpu_the_cost_is_delta_frag_plus_the_fit_term(monkeypatch, profile, left):
    mix = FR.DemandMix(refresh_every=1)
    monkeypatch.setattr(FR, "FIT_WEIGHT", 0.0)
    _, delta = FR.FragCache(mix).best_start("a100-80gb", mig.A100_80GB, (), profile)
    monkeypatch.setattr(FR, "FIT_WEIGHT", 0.4)
    _, cost = FR.FragCache(mix).best_start("a100-80gb", mig.A100_80GB, (), profile)
    assert cost - delta == pytest.approx(0.4 * left)


def test_the_fit_term_is_the_same_for_every_start_and_added_to_delta_frag(monkeypatch):
    mix = FR.DemandMix(refresh_every=1)
    for _ in range(50):
        mix.observe(Request(memory_gb=10))
    layout = (("3g.40gb", 0),)
    monkeypatch.setattr(FR, "FIT_WEIGHT", 0.0)
    start0, delta0 = FR.FragCache(mix).best_start("a100-80gb", mig.A100_80GB, layout, "1g.10gb")
    monkeypatch.setattr(FR, "FIT_WEIGHT", 0.4)
    start, cost = FR.FragCache(mix).best_start("a100-80gb", mig.A100_80GB, layout, "1g.10gb")
    assert start == start0
    left = FR.free_share(mig.A100_80GB, layout + (("1g.10gb", start),))
    assert cost == pytest.approx(delta0 + 0.4 * left)


@pytest.mark.parametrize("fit_weight,expected", [
    (0.4, "half"),  # the tightest fit: beside the 3g.40gb, not on the empty GPU that comes first in pool order
])
def test_a_slice_goes_to_the_tightest_fit(monkeypatch, fit_weight, expected):
    monkeypatch.setattr(FR, "FIT_WEIGHT", fit_weight)
    mix = FR.DemandMix(refresh_every=1)
    for _ in range(200):
        mix.observe(Request(memory_gb=10))
    pool = Pool([node("n0", gpu("empty")), node("n1", gpu("half", instances=[("3g.40gb", 0)]))], mix=mix)
    for mode in ("fast", "exhaustive"):
        d = Scheduler(pool, weights=Weights(packing=1.0), adapt_weights=False, mode=mode).decide(
            Request(memory_gb=10))
        assert d.placements[0].gpu_uuid == expected, mode
