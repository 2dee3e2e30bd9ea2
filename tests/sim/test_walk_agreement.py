"""The fast walk against the exhaustive reference on the states a replay really passes through: a modern pool
(8-GPU A100/H100 nodes beside single-GPU L4/A10 servers) and the openb pool with sharing-heavy and pinned
mixes, under load, every decision re-scored. The decision speed bench's random pools never held part-used
A100s ahead of a free L4 in the static order; the modern replay does (docs/performance.md, "Free GPUs that are
not split are in the packing walk")."""
from __future__ import annotations

import pytest

from scheduler.core.engine import Pool, Scheduler
from scheduler.sim import generalise as G
from scheduler.sim.policies import NoPreemption
from scheduler.sim.run import DEFAULT_TRACE, DEFAULT_TRACE_DIR, prepare, run_policy
from scheduler.sim.variants import PodVariant


class Compared:
    """The engine's fast choice, with the exhaustive mode's best score on the same pool noted beside it."""

    def __init__(self, pool: Pool) -> None:
        self.fast = Scheduler(pool, mode="fast")
        self.exhaustive = Scheduler(pool, mode="exhaustive")
        self.gaps: list[tuple[float, str]] = []

    def decide(self, request, *, allow_preemption: bool = False, explain: bool = True):
        d = self.fast.decide(request, allow_preemption=allow_preemption, explain=explain)
        if d.ok:
            best = self.exhaustive.decide(request, allow_preemption=False, explain=False)
            kind = G.request_kind(request)
            self.gaps.append(((best.score - self.exhaustive.rescore(d, request)) / best.score, kind))
        return d


_NAMED = {c.name: c for c in G.TUNE_ON + G.SCREEN_ON}
CASES = {
    "modern": _NAMED["modern-cb"],  # where the walk missed free L4s before the fix
    "openb-shared": _NAMED["share85t"],
    "openb-pinned": G.Case("pinned", variant=PodVariant(spec=0.3, multi=0.1, seed=62)),
}


@pytest.mark.skipif(not (DEFAULT_TRACE_DIR / DEFAULT_TRACE).exists(), reason="openb traces not present")
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_fast_decision_of_a_replay_scores_as_the_exhaustive_one(name):
    case = CASES[name]
    prepared = prepare(case.config(load=8.0, limit=1500))
    made: list[Compared] = []

    def factory(nodes):
        pool = Pool(nodes)
        made.append(Compared(pool))
        return pool, NoPreemption(made[-1])

    run_policy(prepared, "compared", factory)
    live = made[0]  # the replay's own pool (the second is its empty probe)
    assert len(live.gaps) > 1000 and {k for _, k in live.gaps} >= {"slice", "whole"}
    below = sorted(((g, k) for g, k in live.gaps if g > 1e-9), reverse=True)
    assert not below, f"{len(below)} of {len(live.gaps)} decisions below the exhaustive score, worst {below[:3]}"
