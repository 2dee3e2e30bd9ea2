"""Metric definitions, the same for every policy (docs/simulator.md explains each).

- allocation: time-average over the window [T0, T1] of (sum over running jobs of the GPUs the trace pod
  asked for, num_gpu x gpu_milli / 1000) / (GPUs in the pool). It counts what the work needs, not what the
  policy locked up for it, so a 0.3-GPU pod counts 0.3 whether it got a 1g slice or a whole GPU.
- held: the same integral over what the policy locked up: a MIG instance counts its compute slices / the
  GPU's compute slices (3g on an A100 = 3/7), a whole GPU counts 1. held - allocation is waste.
- fragmentation: time-average of (sum over GPUs of the GPU's fragmented share) / GPUs (see fragmentation.py).
- waits: start - arrival of every job that started; percentiles are nearest-rank (the smallest wait that at
  least p% of jobs did not exceed), so every reported wait is one some job really had.
T1 is the last arrival (after --load compression; `--window drain` makes it the last completion instead):
the window in which the trace offers work. Jobs still queued at T1 keep running to completion for the wait
figures, but the tail of the drain is not averaged in, because a long drain of one 140-day job would
otherwise dilute every policy's average to nothing. T0 is the arrival of the pod at the `warmup` quantile
(1% by default): openb's first few dozen pods were created months before the rest (long-running pods that
were up when the recording began) and the pool is nearly idle until the bulk arrives; averaging over those
months would measure the calendar, not the policy. The warm-up pods are replayed and count for waits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class Levels:
    """Current levels of the pool, integrated over time by `TimeAverages`."""

    allocated: float = 0.0  # GPUs asked for by running jobs
    held: float = 0.0  # GPUs locked up for running jobs (compute share)
    fragmented: float = 0.0  # sum of per-GPU fragmented share
    queued: int = 0


@dataclass
class TimeAverages:
    capacity_gpus: int
    window_end: float
    window_start: float = 0.0
    last_t: float = -math.inf
    allocated_area: float = 0.0
    held_area: float = 0.0
    fragmented_area: float = 0.0
    queued_area: float = 0.0
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (t, allocation, queued)

    def __post_init__(self) -> None:
        self.last_t = max(self.last_t, self.window_start)

    def advance(self, t: float, levels: Levels) -> None:
        """Integrate `levels` (constant since `last_t`) up to `t`, clipped to the window."""
        end = min(t, self.window_end)
        if end > self.last_t:
            dt = end - self.last_t
            self.allocated_area += levels.allocated * dt
            self.held_area += levels.held * dt
            self.fragmented_area += levels.fragmented * dt
            self.queued_area += levels.queued * dt
        self.last_t = max(self.last_t, end)

    def sample(self, t: float, levels: Levels) -> None:
        if self.window_start <= t <= self.window_end:
            self.samples.append((t, levels.allocated / self.capacity_gpus, levels.queued))

    @property
    def span(self) -> float:
        """Length of the window actually integrated: [window_start, min(window_end, last event)]."""
        return self.last_t - self.window_start

    def in_window(self, t: float) -> bool:
        return self.window_start <= t <= self.window_end

    def _avg(self, area: float, per_gpu: bool = True) -> float:
        if self.span <= 0 or self.capacity_gpus <= 0:
            return 0.0
        return area / self.span / (self.capacity_gpus if per_gpu else 1)

    @property
    def allocation(self) -> float:
        return self._avg(self.allocated_area)

    @property
    def held(self) -> float:
        return self._avg(self.held_area)

    @property
    def fragmentation(self) -> float:
        return self._avg(self.fragmented_area)

    @property
    def mean_queue(self) -> float:
        return self._avg(self.queued_area, per_gpu=False)


def downsample(samples: list[tuple[float, float, int]], points: int = 400) -> list[tuple[float, float, int]]:
    """At most `points` samples, keeping the peak of each bucket so a short spike still shows in a plot."""
    if len(samples) <= points:
        return list(samples)
    size = math.ceil(len(samples) / points)
    out = []
    for i in range(0, len(samples), size):
        bucket = samples[i:i + size]
        out.append((bucket[0][0], max(b[1] for b in bucket), max(b[2] for b in bucket)))
    return out
