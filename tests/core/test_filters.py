"""Every filter plugin, table-driven: pass or the reason, never an exception."""
from __future__ import annotations

import pytest

from scheduler.core import filters as F
from scheduler.core.engine import Pool
from scheduler.core.model import Request

from .pools import gpu, node


def check(flt: F.Filter, request: Request, n, g=None) -> str | None:
    pool = Pool([n])
    n2 = pool.nodes[n.id]
    return flt.check(request, n2, pool.gpu((g or n.gpus[0]).uuid), pool)


@pytest.mark.parametrize("online,expected", [(True, None), (False, "node offline")])
def test_node_online_filter_refuses_offline_nodes(online, expected):
    assert check(F.NodeOnline(), Request(), node("n", gpu("g"), online=online)) == expected


@pytest.mark.parametrize("health,mode,expected", [
    ("healthy", "on_demand", None),
    ("cordoned", "spot", "cordoned"),
    ("cordoned", "reserved", "cordoned"),
    ("degraded", "spot", None),
    ("degraded", "on_demand", "degraded (spot only)"),
    ("degraded", "reserved", "degraded (spot only)"),
])
def test_gpu_health_filter_refuses_cordoned_and_allows_degraded_for_spot_only(health, mode, expected):
    assert check(F.GpuHealthy(), Request(mode=mode), node("n", gpu("g", health=health))) == expected


@pytest.mark.parametrize("models,expected", [
    (None, None), (frozenset({"a100-80gb"}), None), (frozenset({"h100-80gb", "l4"}), "wrong model"),
])
def test_model_filter_keeps_only_allowed_models(models, expected):
    assert check(F.ModelAllowed(), Request(models=models), node("n", gpu("g"))) == expected


@pytest.mark.parametrize("node_cuda,required,expected", [
    ("12.4", None, None),
    ("12.4", "12.4", None),
    ("12.6", "12.4", None),
    ("12.10", "12.9", None),  # numeric, not string, comparison
    ("12.2", "12.4", "cuda 12.2 < required 12.4"),
    ("11.8", "12", "cuda 11.8 < required 12"),
    ("12.4.1", "12.4", None),
])
def test_cuda_filter_compares_versions_as_numbers(node_cuda, required, expected):
    assert check(F.CudaVersion(), Request(min_cuda=required), node("n", gpu("g"), cuda=node_cuda)) == expected


@pytest.mark.parametrize("model,required,expected", [
    ("a100-80gb", "8.0", None),
    ("a100-80gb", "9.0", "compute capability 8.0 < required 9.0"),
    ("h100-80gb", "9.0", None),
    ("t4", "8.0", "compute capability 7.5 < required 8.0"),
])
def test_compute_capability_filter(model, required, expected):
    g = gpu("g", model, mig_on=model != "t4")
    assert check(F.ComputeCapability(), Request(min_compute_capability=required), node("n", g)) == expected


@pytest.mark.parametrize("regions,expected", [
    (None, None), (frozenset({"us-east"}), None), (frozenset({"eu-west"}), "region not allowed"),
])
def test_region_filter(regions, expected):
    assert check(F.RegionAllowed(), Request(regions=regions), node("n", gpu("g"), region="us-east")) == expected


@pytest.mark.parametrize("model,mig_on,request_,expected", [
    ("a100-80gb", True, Request(memory_gb=80), None),
    ("a100-80gb", True, Request(memory_gb=81), "no slice with 81 GB and 1 compute slices"),
    ("a100-80gb", True, Request(memory_gb=5, compute_slices=8), "no slice with 5 GB and 8 compute slices"),
    ("a30-24gb", True, Request(memory_gb=20), None),
    ("l4", False, Request(memory_gb=24), None),
    ("l4", False, Request(memory_gb=30), "needs 30 GB per GPU"),
    ("a100-40gb", True, Request(whole_gpu=True, memory_gb=48), "needs 48 GB per GPU"),
    ("a100-80gb", False, Request(memory_gb=60), None),  # MIG off: the whole GPU is the slice
])
def test_memory_filter_asks_whether_the_gpu_or_a_profile_offers_the_slice(model, mig_on, request_, expected):
    assert check(F.MemoryPerSlice(), request_, node("n", gpu("g", model, mig_on=mig_on))) == expected


@pytest.mark.parametrize("request_,expected", [
    # base 2.0/GPU-h. 1g.10gb share 1/7: on demand 1.8 × 2 / 7 = 0.514
    (Request(memory_gb=10, max_price_per_hour=0.52), None),
    (Request(memory_gb=10, max_price_per_hour=0.50), "price over cap 0.5/h"),
    # reserved 0.85 × 2 / 7 = 0.243
    (Request(memory_gb=10, mode="reserved", max_price_per_hour=0.25), None),
    # whole GPU on demand 3.6; two GPUs 7.2
    (Request(whole_gpu=True, max_price_per_hour=3.6), None),
    (Request(gpu_count=2, max_price_per_hour=7.0), "price over cap 7/h"),
    # reserved less than the notice ahead: 1.0 × base (2.0 for a whole GPU)
    (Request(whole_gpu=True, mode="reserved", short_notice=True, max_price_per_hour=2.0), None),
    (Request(whole_gpu=True, mode="reserved", short_notice=True, max_price_per_hour=1.9), "price over cap 1.9/h"),
    # spot on an all-free pool: 50% of base = 1.0 for a whole GPU (below reserved's 1.7)
    (Request(whole_gpu=True, mode="spot", max_price_per_hour=1.0), None),
    (Request(whole_gpu=True, mode="spot", max_price_per_hour=0.9), "spot price over bid 0.9/h"),
    (Request(memory_gb=10), None),
])
def test_price_filter_uses_the_class_price_of_the_slice(request_, expected):
    n = node("n", gpu("g0"), gpu("g1"), price=2.0)
    assert check(F.PriceCap(), request_, n) == expected


@pytest.mark.parametrize("instances,request_,expected", [
    ([], Request(memory_gb=10), None),
    ([("4g.40gb", 0), ("3g.40gb", 4)], Request(memory_gb=10), "no legal placement"),
    ([("4g.40gb", 0)], Request(memory_gb=40), None),  # 3g.40gb at 4
    ([("4g.40gb", 0)], Request(memory_gb=40, compute_slices=4), "no legal placement"),
    ([("1g.10gb", 3)], Request(whole_gpu=True), "GPU busy"),
    ([], Request(whole_gpu=True), None),
])
def test_capacity_filter_needs_a_legal_start_or_a_free_gpu(instances, request_, expected):
    assert check(F.Capacity(), request_, node("n", gpu("g", instances=instances))) == expected


@pytest.mark.parametrize("busy,k,expected", [
    (0, 4, None), (1, 4, "fewer than 4 free GPUs on node"), (2, 2, None), (3, 2, "fewer than 2 free GPUs on node"),
    (4, 1, None),
])
def test_k_gpus_filter_needs_k_free_gpus_on_one_node(busy, k, expected):
    gpus = [gpu(f"g{i}", instances=[("1g.10gb", 0)] if i < busy else []) for i in range(4)]
    assert check(F.GpusOnOneNode(), Request(gpu_count=k), node("n", *gpus)) == expected


def test_k_gpus_filter_does_not_count_cordoned_or_other_models():
    gpus = [gpu("g0"), gpu("g1", health="cordoned"), gpu("g2", "h100-80gb")]
    req = Request(gpu_count=2, models=frozenset({"a100-80gb"}))
    assert check(F.GpusOnOneNode(), req, node("n", *gpus)) == "fewer than 2 free GPUs on node"


@pytest.mark.parametrize("flt", F.DEFAULT_FILTERS, ids=lambda f: f.name)
def test_no_filter_raises_on_odd_but_valid_input(flt):
    odd = Request(models=frozenset(), memory_gb=10_000, compute_slices=0, min_cuda="x.y",
                  min_compute_capability="", regions=frozenset(), mode="spot", max_price_per_hour=0.0)
    result = check(flt, odd, node("n", gpu("g", instances=[("7g.80gb", 0)]), cuda="weird"))
    assert result is None or isinstance(result, str)


@pytest.mark.parametrize("text,expected", [("12.4", (12, 4)), ("12.10", (12, 10)), ("12", (12,)),
                                           ("12.0", (12,)), ("v12.4-rc1", (12, 4)), ("x.y", (0,))])
def test_version_tuple_parses_versions_numerically(text, expected):
    assert F.version_tuple(text) == expected
