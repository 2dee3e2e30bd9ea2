"""The fast path's kind walk (fast_path.KIND_HEADS): a whole-GPU request's packing cost is its GPU kind's
(placement.whole_cost), which the static walk's order (price per PU, reliability) does not see. Beside the
static walk the heads of every kind's lists are scored, so a kind the demand mix wants taken whole is found
however many cheaper GPUs of other kinds come first (issue 12 §2: multi-GPU-heavy mixes)."""
from __future__ import annotations

import pytest

from scheduler.core.engine import Pool, Scheduler
from scheduler.core.model import Request

from .pools import gpu, node


def _pool(decoys: int) -> Pool:
    # the A100-80GBs are a little cheaper per PU than the A30 (0.200 against 0.210 $/PU-h), so the static walk
    # (price per PU, reliability) meets all of them first
    nodes = [node(f"a100-{i}", gpu(f"a100-{i}-g0", "a100-80gb"), price=2.0) for i in range(decoys)]
    nodes.append(node("a30", gpu("a30-g0", "a30-24gb"), price=1.0))
    pool = Pool(nodes)
    for _ in range(200):  # the mix: 40 GB slices (3g.40gb on an A100-80GB), which no A30 profile holds, so
        pool.mix.observe(Request(memory_gb=40))  # taking an A100 whole costs slice demand, an A30 less
    pool.mix.refresh()
    return pool


@pytest.mark.parametrize("decoys", [3, 23, 24, 60])
def test_whole_request_finds_the_kind_its_packing_cost_prefers(decoys):
    request = Request(whole_gpu=True)
    fast = Scheduler(_pool(decoys), mode="fast", max_candidates=24).decide(request)
    exhaustive = Scheduler(_pool(decoys), mode="exhaustive").decide(request)
    assert exhaustive.placements[0].gpu_uuid == "a30-g0"
    assert fast.placements == exhaustive.placements
    assert fast.score == pytest.approx(exhaustive.score)
