"""An upper bound on the allocation any policy could reach on a run: how far from the best possible a policy is.

Allocation (metrics.py) is the work done inside the window [a, b] (Σ over running jobs of the GPUs the pod
asked for, integrated over time) divided by capacity × (b − a). The bound is a fluid relaxation of the same
arrivals: a job may start at its arrival at the earliest, runs at its own rate (its share of GPUs) for its
runtime, and the pool does at most `capacity` GPUs of work at any instant; GPUs, MIG geometry, nodes and the
queue are relaxed away (a job may even be split across GPUs). For any cut t in [a, b]:

    work in [a, b] <= capacity × (t − a) + Σ_jobs share × clip(min(runtime, b − max(t, arrival)), 0)

(before t the pool is the limit, after t each job's own remaining span is), so the minimum over cuts is a
bound no policy can beat — not even one that knows the future. Jobs whose shape fits no GPU of the empty pool
are left out (no policy can run them). It bounds allocation only: fragmentation's bound is the trivial 0 and
is not printed. At light load the bound is the work offered (every policy reaches it when nobody waits).
"""
from __future__ import annotations

from typing import Callable, Iterable

from .simulate import Job

CUTS = 256  # cut points in [a, b]; any cut gives a valid bound, more cuts a tighter one


def allocation_bound(jobs: Iterable[Job], capacity: float, window: tuple[float, float], *,
                     fits: Callable[[Job], bool] = lambda job: True, cuts: int = CUTS) -> float:
    """Largest allocation (0..1) any policy could average over `window` with these arrivals (see above)."""
    a, b = window
    if capacity <= 0 or b <= a:
        return 0.0
    # (arrival, runtime, share) of each job that could run inside the window: a job that arrived before a
    # may have been held back into it, so only arrivals after b are left out
    spans = [(j.arrival, j.pod.runtime, j.demand.share) for j in jobs if j.arrival < b and fits(j)]
    points = sorted({a + (b - a) * i / cuts for i in range(cuts + 1)})
    best = capacity * (b - a)
    for t in points:
        rest = 0.0
        for arrival, runtime, share in spans:
            start = t if t > arrival else arrival
            if start < b:
                rest += share * min(runtime, b - start)
        best = min(best, capacity * (t - a) + rest)
    return best / (capacity * (b - a))
