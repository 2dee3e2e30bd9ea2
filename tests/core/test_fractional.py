"""Fractional GPU sharing (scheduler.core.fractional) and the paper's policies on it (scheduler.core.paper)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.fractional import (
    MILLI,
    FracNode,
    FracPod,
    FractionalCluster,
    FragTable,
    WorkloadMix,
    after_exclusive,
    node_frag,
)
from scheduler.core.paper import POLICIES, FgdPolicy, sigmoid_score

MODELS = ("T4", "V100M16", "G2")

node_st = st.builds(FracNode, id=st.just(""), model=st.sampled_from(MODELS), gpus=st.sampled_from([1, 2, 4, 8]),
                    cpu_milli=st.integers(2000, 64000), memory_mib=st.integers(4096, 262144))


@st.composite
def pod_st(draw):
    kind = draw(st.sampled_from(["cpu", "share", "whole", "multi"]))
    cpu, mem = draw(st.integers(0, 16000)), draw(st.integers(0, 65536))
    models = draw(st.none() | st.frozensets(st.sampled_from(MODELS), min_size=1, max_size=2))
    if kind == "cpu":
        return FracPod(cpu, mem)
    if kind == "share":
        return FracPod(cpu, mem, 1, draw(st.integers(1, 999)), models)
    return FracPod(cpu, mem, 1 if kind == "whole" else draw(st.sampled_from([2, 4, 8])), MILLI, models)


def check_invariants(c: FractionalCluster) -> None:
    real = np.arange(c.free.shape[1])[None, :] < c.gpu_count[:, None]
    assert ((c.free >= 0) & (c.free <= MILLI))[real].all(), "a GPU holds more than 1000 milli or less than 0"
    assert (c.free[~real] == -1).all(), "a GPU slot that does not exist was used"
    assert (c.cpu_left >= 0).all() and (c.cpu_left <= c.cpu_cap).all(), "CPU over capacity"
    assert (c.mem_left >= 0).all() and (c.mem_left <= c.mem_cap).all(), "memory over capacity"
    used = int(np.where(real, MILLI - c.free, 0).sum())
    assert used == c.allocated_milli == int((c.gpu_count * MILLI - c.gpu_left).sum())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(node_st, min_size=1, max_size=6), pods=st.lists(pod_st(), min_size=1, max_size=40),
       policy=st.sampled_from(sorted(POLICIES)), seed=st.integers(0, 5))
def test_no_policy_puts_a_gpu_over_1000_milli_or_a_node_over_its_cpu_or_memory(nodes, pods, policy, seed):
    nodes = [FracNode(f"n{i}", n.model, n.gpus, n.cpu_milli, n.memory_mib) for i, n in enumerate(nodes)]
    c = FractionalCluster(nodes)
    sched = POLICIES[policy](c, mix=WorkloadMix(pods), seed=seed)
    for pod in pods:
        could = len(c.feasible(pod)) > 0
        placed = sched.place(pod)
        assert placed == could, "a policy dropped a pod some node could take, or placed one none could"
        check_invariants(c)


@settings(max_examples=60, deadline=None)
@given(node=node_st, pods=st.lists(pod_st(), min_size=1, max_size=20), data=st.data())
def test_allocate_refuses_what_does_not_fit_and_changes_nothing(node, pods, data):
    c = FractionalCluster([node])
    for pod in pods:
        gpus = data.draw(st.lists(st.integers(0, 8), min_size=pod.num_gpu, max_size=pod.num_gpu))
        before = (c.free.copy(), c.cpu_left.copy(), c.mem_left.copy(), c.allocated_milli)
        try:
            c.allocate(0, pod, gpus)
        except ValueError:
            assert (c.free == before[0]).all() and (c.cpu_left == before[1]).all()
            assert (c.mem_left == before[2]).all() and c.allocated_milli == before[3]
        check_invariants(c)


def test_allocate_names_what_is_short():
    c = FractionalCluster([FracNode("n0", "T4", 1, 4000, 4096)])
    c.allocate(0, FracPod(1000, 1024, 1, 600), [0])
    with pytest.raises(ValueError, match="has not 500 milli left"):
        c.allocate(0, FracPod(1000, 1024, 1, 500), [0])
    with pytest.raises(ValueError, match="lacks CPU or memory"):
        c.allocate(0, FracPod(4000, 1024, 1, 100), [0])
    with pytest.raises(ValueError, match="the pod asks"):
        c.allocate(0, FracPod(1000, 1024, 1, 100, frozenset({"G2"})), [0])
    with pytest.raises(ValueError, match="needs 1 distinct GPUs"):
        c.allocate(0, FracPod(1000, 1024, 1, 100), [])


@pytest.mark.parametrize("num_gpu, gpu_milli", [(2, 500), (1, 1001), (1, 0), (-1, 0)])
def test_pod_shapes_the_model_cannot_hold_are_refused(num_gpu, gpu_milli):
    with pytest.raises(ValueError):
        FracPod(1000, 1024, num_gpu, gpu_milli)


MIX = WorkloadMix([FracPod(2000, 1024, 1, 500), FracPod(8000, 1024, 2, MILLI), FracPod(1000, 1024),
                   FracPod(1000, 1024, 1, 300, frozenset({"T4"}))])  # 1/4 each


@pytest.mark.parametrize("model, gpus, cpu, expected", [
    # empty 2-GPU node, CPU for all: the CPU-only pod and the T4-pinned pod see all 2000 as fragment
    ("G2", (1000, 1000), 64000, 0.25 * 2000 + 0.25 * 2000),
    # the same on a T4: the pinned pod fits, so only the CPU-only pod counts
    ("T4", (1000, 1000), 64000, 0.25 * 2000),
    # 400 + 1000 left: 500-pod fits (400 short), 2-GPU pod does not (1400), CPU pod (1400), pinned no access (1400)
    ("G2", (400, 1000), 64000, 0.25 * 400 + 0.25 * 1400 + 0.25 * 1400 + 0.25 * 1400),
    # CPU 4000 < the 2-GPU pod's 8000: it sees all 2000 as fragment even with both GPUs free
    ("G2", (1000, 1000), 4000, 0.25 * 2000 + 0.25 * 2000 + 0.25 * 2000),
    ("G2", (0, 0), 64000, 0.0),
])
def test_node_fragmentation_follows_the_paper_case_by_case(model, gpus, cpu, expected):
    assert node_frag(model, gpus, MIX, cpu) == pytest.approx(expected)
    assert FragTable(MIX)(model, tuple(sorted(gpus)), cpu, 10**9) == pytest.approx(expected)


def test_the_memory_check_counts_only_when_asked():
    mix = WorkloadMix([FracPod(1000, 50_000, 1, 500)])
    assert FragTable(mix)("G2", (1000,), 64000, 10_000) == 0.0  # the paper's measure: memory not checked
    assert FragTable(mix, memory=True)("G2", (1000,), 64000, 10_000) == 1000.0


def test_a_multi_gpu_pod_takes_the_tightest_gpus_that_hold_it():
    assert after_exclusive((300, 1000, 1000, 1000), 2, MILLI) == (0, 0, 300, 1000)
    assert after_exclusive((300, 1000), 2, MILLI) is None


def test_fgd_score_is_the_artifacts_integer_sigmoid():
    assert sigmoid_score(0) == 50
    assert sigmoid_score(-550) == 36 and sigmoid_score(150) == 53


def test_the_engines_node_term_charges_breaking_the_last_free_pair_for_two_gpu_pods():
    class WithNodeTerm(FgdPolicy):
        node_term = True

    mix = WorkloadMix([FracPod(1000, 1024, 1, 500), FracPod(1000, 1024, 2, MILLI)])  # 1/2 each
    c = FractionalCluster([FracNode("n0", "G2", 2, 64000, 65536)])
    plain, charged = FgdPolicy(c, mix=mix), WithNodeTerm(c, mix=mix)
    before = plain.frag("G2", (1000, 1000), 64000, 65536)
    # a 500-milli pod on one of two free GPUs: the 2-GPU pod (p 1/2) loses its node: fragmentation.node_delta
    # counts the one free whole GPU left, 1/2 x 1 GPU = 500 milli more
    a = plain.decrease("G2", before, (1000, 1000), (500, 1000), 63000, 64512)
    b = charged.decrease("G2", before, (1000, 1000), (500, 1000), 63000, 64512)
    assert a - b == pytest.approx(500.0)
