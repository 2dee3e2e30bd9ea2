"""The pool's incremental reason buckets and spot index against brute force (hypothesis): reason counts
equal checking every GPU's filters one by one, and preemption plans from the spot index equal trying every
GPU and node, on random pools and after any sequence of places, releases, health and node changes."""
from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import preemption
from scheduler.core.engine import Pool, Scheduler
from scheduler.core.model import Request

from .test_properties import SETTINGS, assert_walk_indexes_match, pools, requests

# requests that also exercise the region, CUDA and price filters (a price cap takes the O(nodes) count)
constrained = st.builds(
    Request,
    models=st.one_of(st.none(), st.frozensets(st.sampled_from(["a100-80gb", "h100-80gb", "a30-24gb", "l4"]),
                                              min_size=1)),
    memory_gb=st.sampled_from([0, 5, 10, 20, 40, 80]),
    compute_slices=st.integers(1, 4),
    whole_gpu=st.booleans(),
    gpu_count=st.sampled_from([1, 1, 2, 3]),
    mode=st.sampled_from(["reserved", "on_demand", "spot"]),
    regions=st.one_of(st.none(), st.just(frozenset({"us-east"}))),
    min_cuda=st.sampled_from([None, "12.4", "12.6"]),
    max_price_per_hour=st.sampled_from([None, None, 0.5, 2.0]),
    buyer_region=st.sampled_from([None, "us-east", "eu-west"]),
)

changes = st.lists(st.tuples(st.sampled_from(["place", "release", "health", "offline", "online", "cuda",
                                              "interruptions"]),
                             st.integers(0, 50), requests), max_size=10)


def brute_force_reasons(sched: Scheduler, request: Request) -> dict[str, int]:
    """Every GPU's first refusal, no grouping, no cache."""
    counts: Counter[str] = Counter()
    for rec in sched.pool.records:
        reason = sched.first_refusal(request, rec.node, rec.gpu)
        if reason:
            counts[reason] += 1
    return dict(counts)


def apply(pool: Pool, sched: Scheduler, steps) -> None:
    for k, (what, n, r) in enumerate(steps):
        rec = pool.records[n % len(pool.records)]
        node_id = rec.node.id
        if what == "place":
            r.lease_id = f"req-{k}"
            sched.place(r)
        elif what == "release" and rec.gpu.instances:
            pool.release(rec.gpu.uuid, rec.gpu.instances[n % len(rec.gpu.instances)].lease_id)
        elif what == "health":
            pool.set_gpu_health(rec.gpu.uuid, ["healthy", "degraded", "cordoned"][n % 3])
        elif what in ("offline", "online"):
            pool.set_node(node_id, online=what == "online")
        elif what == "cuda":
            pool.set_node(node_id, cuda_version=["12.2", "12.4", "12.6"][n % 3])
        elif what == "interruptions":  # moves the node in the spot order
            pool.set_node(node_id, interruption_rate=[0.0, 0.05, 0.4][n % 3])


@SETTINGS
@given(nodes=pools(), steps=changes, probes=st.lists(constrained, min_size=1, max_size=4))
def test_reason_counts_equal_checking_every_gpu_after_any_changes(nodes, steps, probes):
    pool = Pool(nodes)
    sched = Scheduler(pool)
    apply(pool, sched, steps)
    # max_candidates=0: "k GPUs on one node" is counted over the free-node buckets instead of the nodes
    # with k free GPUs (Scheduler._per_node_bounded), whenever any node has k free GPUs
    by_buckets = Scheduler(pool, max_candidates=0)
    for r in probes:
        expected = brute_force_reasons(sched, r)
        assert sched.reasons(r) == expected
        assert by_buckets.reasons(r) == expected
        assert sched._node_group_reasons(r) == expected


@SETTINGS
@given(nodes=pools(), steps=changes)
def test_reason_buckets_and_spot_index_match_a_rebuild(nodes, steps):
    pool = Pool(nodes)
    apply(pool, Scheduler(pool), steps)
    rebuilt = Pool(list(pool.nodes.values()))

    def buckets(p):
        return {kind: {k: set(v) for k, v in b.items()} for kind, b in p.reason_buckets.items() if b}

    def free_nodes(p):
        return {c: {f: set(v) for f, v in b.items()} for c, b in p.free_nodes.items()}

    assert buckets(pool) == buckets(rebuilt)
    assert free_nodes(pool) == free_nodes(rebuilt)
    assert_walk_indexes_match(pool, rebuilt)
    assert {k: v for k, v in pool.spot_lb.items() if v} == {k: v for k, v in rebuilt.spot_lb.items() if v}
    assert pool.spot_gpus == rebuilt.spot_gpus
    models = sorted({r.gpu.model for r in pool.records})
    for k in (1, 2, 3):
        assert pool.nodes_for_preemption(k) == rebuilt.nodes_for_preemption(k)
        for model in models:  # the per-model index: the nodes with a GPU of that model, from the full list
            expected = [n for n in rebuilt.nodes_for_preemption(k)
                        if any(r.gpu.model == model for r in rebuilt.by_node[n])]
            assert pool.nodes_for_preemption(k, [model]) == expected
            assert rebuilt.nodes_for_preemption(k, [model]) == expected


@SETTINGS
@given(nodes=pools(), steps=changes, probes=st.lists(constrained, min_size=1, max_size=4))
def test_preemption_plan_from_the_spot_index_is_the_brute_force_cheapest_plan(nodes, steps, probes):
    pool = Pool(nodes)
    sched = Scheduler(pool)
    apply(pool, sched, steps)
    weights = sched.weights()
    for r in probes:
        a = preemption.plan(sched, r, weights)
        b = preemption.plan_brute_force(sched, r, weights)
        assert (a is None) == (b is None)
        if a is not None:
            assert (a.placements(), a.preempt) == (b.placements(), b.preempt)  # type: ignore[union-attr]


def test_reasons_count_in_buckets_without_a_price_cap_and_per_node_with_one():
    from .pools import gpu, node
    nodes = [node(f"n{i}", gpu(f"n{i}-g0"), gpu(f"n{i}-g1", instances=[("7g.80gb", 0)]), price=1.0 + i)
             for i in range(4)]
    sched = Scheduler(Pool(nodes))
    assert sched._bucket_reasons(Request(gpu_count=2)) == {"GPU busy": 4, "fewer than 2 free GPUs on node": 4}
    assert sched._bucket_reasons(Request(memory_gb=10, max_price_per_hour=1.0)) is None  # per node instead
    assert sched.reasons(Request(whole_gpu=True, max_price_per_hour=3.7)) == {
        "price over cap 3.7/h": 4, "GPU busy": 2}  # on demand 1.8 × base: n2, n3 over the cap


@SETTINGS
@given(nodes=pools(), steps=changes, probes=st.lists(constrained, min_size=1, max_size=4))
def test_memoised_options_equal_computing_them_afresh_after_any_changes(nodes, steps, probes):
    """placement.single_option's per-pool memo (sig, layout, request size, node free count, mix version)
    gives the option computed from scratch, for every GPU, after random places, releases and changes."""
    from scheduler.core.placement import _single_option, single_option
    pool = Pool(nodes)
    sched = Scheduler(pool)
    for r in probes:  # fill the memo before the changes, so stale entries would show
        for rec in pool.records:
            single_option(pool, rec.node, rec.gpu, r, idx=rec.idx)
    apply(pool, sched, steps)
    for r in probes:
        for rec in pool.records:
            for _ in range(2):  # the first call may fill the memo, the second reads it
                got = single_option(pool, rec.node, rec.gpu, r, idx=rec.idx)
                want = _single_option(pool, rec.node, rec.gpu, r, None, rec.idx, True)
                assert (got is None) == (want is None)
                if got is not None:
                    assert (got.profile, got.start, got.pack_cost, got.price_per_hour, got.pu, got.idx) == \
                        (want.profile, want.start, want.pack_cost, want.price_per_hour, want.pu, want.idx)
