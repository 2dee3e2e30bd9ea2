"""Metric definitions: nearest-rank percentiles, time averages clipped to the window, fragmentation."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.hardware import mig
from scheduler.core.model import GpuState, PlacedInstance, Placement
from scheduler.sim.frag import FragMeter, demand_mix
from scheduler.sim.mapping import Demand
from scheduler.sim.metrics import Levels, TimeAverages, downsample, percentile


@pytest.mark.parametrize("p, expected", [(0, 1), (50, 3), (90, 5), (95, 5), (99, 5), (100, 5), (20, 1), (21, 2)])
def test_percentile_is_nearest_rank(p: float, expected: float) -> None:
    assert percentile([5, 1, 4, 2, 3], p) == expected


def test_percentile_of_nothing_is_zero() -> None:
    assert percentile([], 99) == 0.0


def test_time_average_integrates_levels_inside_the_window_only() -> None:
    avg = TimeAverages(capacity_gpus=4, window_end=30, window_start=10)
    avg.advance(5, Levels(allocated=4))   # before the window: ignored
    avg.advance(20, Levels(allocated=2, held=3, fragmented=1, queued=6))  # [10, 20): 2 GPUs of 4
    avg.advance(50, Levels(allocated=4, held=4, queued=0))  # [20, 30): 4 of 4; after 30 ignored
    assert avg.span == 20
    assert avg.allocation == pytest.approx((2 * 10 + 4 * 10) / (4 * 20))
    assert avg.held == pytest.approx((3 * 10 + 4 * 10) / (4 * 20))
    assert avg.fragmentation == pytest.approx(10 / (4 * 20))
    assert avg.mean_queue == pytest.approx(60 / 20)


def test_downsample_keeps_peaks() -> None:
    samples = [(float(t), 0.1, 0) for t in range(1000)]
    samples[501] = (501.0, 0.9, 7)
    out = downsample(samples, 100)
    assert len(out) == 100 and max(s[1] for s in out) == 0.9 and max(s[2] for s in out) == 7


def gpu(instances: list[tuple[str | None, int]]) -> GpuState:
    return GpuState("g", "n", "a100-80gb", mig.A100_80GB, [PlacedInstance(p, s) for p, s in instances])


def test_fragmentation_uses_a_fixed_mix_of_the_traces_own_profiles() -> None:
    # Every demand is a 3g.40gb on an A100-80GB: the mix is 3g only.
    mix = demand_mix([Demand(False, 1, 37.6, 1, None, 2, 0.47)], ["a100-80gb", "a10"])
    assert mix == {"a100-80gb": (("3g.40gb", 1.0),)}
    meter = FragMeter(mix)
    assert meter.of(gpu([])) == 0.0  # 3g fits at 0 and 4: every free slice is usable
    assert meter.of(gpu([("3g.40gb", 0)])) == 0.0
    # A 1g at slice 0 blocks the 3g start at 0: slices 1-3 are free but no 3g can use them -> 3/8.
    assert meter.of(gpu([("1g.10gb", 0)])) == pytest.approx(3 / 8)
    assert meter.of(gpu([(None, 0)])) == 0.0  # rented whole: full, not fragmented


def test_held_counts_compute_share_of_slices_and_whole_gpus() -> None:
    g = gpu([])
    gpus = {"g": g, "w": GpuState("w", "n", "a10", None)}
    assert FragMeter.held(gpus, [Placement("n", "g", "3g.40gb", 0)]) == pytest.approx(3 / 7)
    assert FragMeter.held(gpus, [Placement("n", "g", None, 0), Placement("n", "w", None, 0)]) == 2.0


def test_the_simulator_never_imports_django_or_its_friends() -> None:
    code = ("import sys, scheduler.sim.cli, scheduler.sim.run, scheduler.sim.policies, scheduler.sim.report\n"
            "from scheduler.sim.policies import factory; factory('ours'); factory('first-fit')\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('django', 'rest_framework', 'channels', 'celery'))\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == ""
