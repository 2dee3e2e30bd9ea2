"""The policies a replay compares, each built fresh on its own `engine.Pool`.

Every policy is the engine's own object (scheduler.core.engine.Scheduler or a scheduler.core.baselines
policy): the simulator never places anything itself. The names, "before" first:

- whole-gpu   renting whole GPUs, first fit: every request takes whole GPUs (the articles' "before")
- first-fit   the first GPU (pool order) with a legal slot, lowest start
- best-fit    the GPU left with the least free capacity after the slice
- random-fit  a random GPU with a legal slot (seeded)
- naive-scan  the seed article's scan-score-sort over every GPU
- ours        the engine's fast Scheduler (filters, normalised scores, adaptive weights, FGD-style packing)

Simulated requests are on demand and nothing is spot, so preemption never has anything to take: it is
switched off to keep each failed decision to the reasons scan.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from scheduler.core.model import Decision, NodeState, Request

from .errors import SimInputError

POLICY_NAMES = ("whole-gpu", "first-fit", "best-fit", "random-fit", "naive-scan", "ours")

# policy name -> key of scheduler.core.baselines.POLICIES
_BASELINE_NAMES: dict[str, str] = {
    "whole-gpu": "whole_gpu",
    "first-fit": "first_fit",
    "best-fit": "best_fit",
    "random-fit": "random_fit",
    "naive-scan": "naive_scan",
}


class NoPreemption:
    """Calls `decide(request, allow_preemption=False)`, and `explain=False` where the policy supports it:
    the live pool never needs the O(pool) reason count, only the empty-pool probe does."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        try:
            params = inspect.signature(policy.decide).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        self._preempt_kw = "allow_preemption" in params
        self._explain_kw = "explain" in params

    def decide(self, request: Request, *, explain: bool = True) -> Decision:
        kw: dict[str, bool] = {}
        if self._preempt_kw:
            kw["allow_preemption"] = False
        if self._explain_kw and not explain:
            kw["explain"] = False
        return self.policy.decide(request, **kw)


def _baseline(name: str, seed: int) -> Callable[[Any], Any]:
    from scheduler.core import baselines

    if name == "random-fit":
        return lambda pool: baselines.RandomFit(pool, seed=seed)
    return baselines.POLICIES[_BASELINE_NAMES[name]]


def factory(name: str, *, seed: int = 0) -> Callable[[list[NodeState]], tuple[Any, Any]]:
    """(nodes) -> (pool, policy) for one policy name."""
    from scheduler.core.engine import Pool, Scheduler

    if name == "ours":
        build: Callable[[Any], Any] = lambda pool: Scheduler(pool, mode="fast")
    elif name in _BASELINE_NAMES:
        build = _baseline(name, seed)
    else:
        raise SimInputError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")

    def make(nodes: list[NodeState]) -> tuple[Any, Any]:
        pool = Pool(nodes)
        return pool, NoPreemption(build(pool))
    return make


def factories(names: list[str] | tuple[str, ...] = POLICY_NAMES, *, seed: int = 0
              ) -> dict[str, Callable[[list[NodeState]], tuple[Any, Any]]]:
    return {n: factory(n, seed=seed) for n in names}
