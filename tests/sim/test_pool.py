"""Pool building: the openb node list through the mapping, scaled by model; the modern pool; prices."""
from __future__ import annotations

import pytest

from scheduler.core import perf
from nodeagent.hardware.gpus import model_for
from scheduler.sim.mapping import DEFAULT_MODEL_MAP
from scheduler.sim.pool import PRICE_PER_PU_HOUR, modern_pool, node_states, openb_pool, pool_summary
from scheduler.sim.trace import TraceNode

NODES = [TraceNode(f"n{i:02d}", 8, "G2") for i in range(10)] + [TraceNode(f"t{i}", 2, "T4") for i in range(4)]


def test_full_scale_maps_every_node() -> None:
    s = pool_summary(openb_pool(NODES, DEFAULT_MODEL_MAP))
    assert s["gpus"] == 88
    assert s["by_model"] == {"G2 -> a100-80gb": {"nodes": 10, "gpus": 80}, "T4 -> a30-24gb": {"nodes": 4, "gpus": 8}}


@pytest.mark.parametrize("scale, g2_nodes, t4_nodes", [(0.5, 5, 2), (0.2, 2, 1), (0.01, 1, 1)])
def test_scaling_keeps_each_model_present_and_spreads_through_the_list(scale: float, g2_nodes: int,
                                                                        t4_nodes: int) -> None:
    specs = openb_pool(NODES, DEFAULT_MODEL_MAP, scale=scale)
    assert sum(s.source_model == "G2" for s in specs) == g2_nodes
    assert sum(s.source_model == "T4" for s in specs) == t4_nodes
    if scale == 0.5:
        assert [s.id for s in specs if s.source_model == "G2"] == ["n00", "n02", "n04", "n06", "n08"]


def test_modern_pool_follows_design_section_9() -> None:
    s = pool_summary(modern_pool())
    assert s["by_model"] == {
        "A100-80GB -> a100-80gb": {"nodes": 432, "gpus": 3456}, "A800-80GB -> a100-80gb": {"nodes": 22, "gpus": 176},
        "H800 -> h800-80gb": {"nodes": 219, "gpus": 1752}, "A10 -> a10": {"nodes": 2494, "gpus": 2494},
    }


def test_every_gpu_costs_the_same_per_performance_unit() -> None:
    nodes = node_states(openb_pool(NODES, DEFAULT_MODEL_MAP, scale=0.2))
    for n in nodes:
        pu = perf.gpu_pu(model_for(n.gpus[0].model))
        assert n.price_per_gpu_hour / pu == pytest.approx(PRICE_PER_PU_HOUR, rel=1e-3)
    assert all(g.geometry is not None for n in nodes for g in n.gpus)
