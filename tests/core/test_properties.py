"""Properties over random pools and request streams (hypothesis): whatever the scheduler decides is legal."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.hardware import mig
from scheduler.core.baselines import POLICIES
from scheduler.core.engine import Pool, Scheduler
from nodeagent.hardware.gpus import GPU_MODELS
from scheduler.core.model import CLASS_RANK, GpuState, NodeState, PlacedInstance, Request

MODELS = ["a100-80gb", "h100-80gb", "a30-24gb", "l4"]


@st.composite
def pools(draw, max_nodes=4):
    nodes = []
    for n in range(draw(st.integers(1, max_nodes))):
        model = draw(st.sampled_from(MODELS))
        spec = GPU_MODELS[model]
        gpus = []
        for j in range(draw(st.integers(1, 3))):
            g = GpuState(f"n{n}-g{j}", f"n{n}", model, spec.mig,
                         health=draw(st.sampled_from(["healthy", "healthy", "degraded", "cordoned"])))
            if spec.mig is not None:
                placed: list[mig.Instance] = []
                for _ in range(draw(st.integers(0, 4))):
                    p = draw(st.sampled_from([p.name for p in spec.mig.profiles]))
                    starts = mig.legal_starts(spec.mig, placed, p)
                    if starts:
                        placed.append(mig.Instance(p, draw(st.sampled_from(starts))))
                g.instances = [PlacedInstance(i.profile, i.start, f"{g.uuid}-{k}",
                                              draw(st.sampled_from(["spot", "on_demand", "reserved"])),
                                              draw(st.floats(0, 10)))
                               for k, i in enumerate(placed)]
            elif draw(st.booleans()):
                g.instances = [PlacedInstance(None, 0, f"{g.uuid}-w", draw(st.sampled_from(["spot", "on_demand"])), 1.0)]
            gpus.append(g)
        nodes.append(NodeState(f"n{n}", draw(st.sampled_from(["us-east", "eu-west"])),
                               price_per_gpu_hour=draw(st.sampled_from([1.0, 2.0, 3.0])), gpus=gpus))
    return nodes


requests = st.builds(
    Request,
    models=st.one_of(st.none(), st.frozensets(st.sampled_from(MODELS), min_size=1)),
    memory_gb=st.sampled_from([0, 5, 10, 20, 40, 80]),
    compute_slices=st.integers(1, 4),
    whole_gpu=st.booleans(),
    gpu_count=st.sampled_from([1, 1, 1, 2]),
    mode=st.sampled_from(["reserved", "on_demand", "spot"]),
    buyer_region=st.sampled_from([None, "us-east", "eu-west"]),
)


def assert_pool_is_legal(pool: Pool) -> None:
    for rec in pool.records:
        g = rec.gpu
        wholes = [i for i in g.instances if i.profile is None]
        if wholes:
            assert len(g.instances) == 1, f"{g.uuid}: a whole-GPU allocation shares the GPU"
            continue
        if g.instances:
            assert g.geometry is not None
            assert mig.layout_problems(g.geometry, [i.as_mig() for i in g.instances]) == [], g.uuid


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(nodes=pools(), stream=st.lists(requests, min_size=1, max_size=12), mode=st.sampled_from(["fast", "exhaustive"]))
def test_placements_never_overlap_exceed_limits_or_use_cordoned_gpus(nodes, stream, mode):
    pool = Pool(nodes)
    s = Scheduler(pool, mode=mode)
    for k, r in enumerate(stream):
        r.lease_id = f"req-{k}"
        cordoned = {rec.gpu.uuid for rec in pool.records if rec.gpu.health == "cordoned"}
        d = s.place(r)
        if d.ok:
            assert not {p.gpu_uuid for p in d.placements} & cordoned
            assert len(d.placements) == r.gpu_count
            assert len({p.node_id for p in d.placements}) == 1
        assert_pool_is_legal(pool)


@SETTINGS
@given(nodes=pools(), request=requests)
def test_preemption_removes_only_spot_and_only_for_higher_classes(nodes, request):
    pool = Pool(nodes)
    classes = {i.lease_id: i.priority for rec in pool.records for i in rec.gpu.instances}
    d = Scheduler(pool).decide(request)
    if d.preempt:
        assert request.mode != "spot"
        assert all(classes[lease] == "spot" for lease in d.preempt)
        assert CLASS_RANK[request.mode] > CLASS_RANK["spot"]
        pool.allocate(d, request)
        assert_pool_is_legal(pool)


@SETTINGS
@given(nodes=pools(max_nodes=3), request=requests)
def test_fast_and_exhaustive_agree_on_small_pools(nodes, request):
    # a small pool is within the fast path's candidate budget, so it sees every fitting GPU
    fast = Scheduler(Pool(nodes), mode="fast").decide(request)
    exhaustive = Scheduler(Pool(nodes), mode="exhaustive").decide(request)
    assert (fast.ok, fast.placements, fast.preempt, fast.reasons) == \
        (exhaustive.ok, exhaustive.placements, exhaustive.preempt, exhaustive.reasons)


@SETTINGS
@given(nodes=pools(), stream=st.lists(requests, min_size=1, max_size=8), policy=st.sampled_from(sorted(POLICIES)))
def test_every_baseline_policy_makes_only_legal_placements(nodes, stream, policy):
    pool = Pool(nodes)
    p = POLICIES[policy](pool)
    for k, r in enumerate(stream):
        r.lease_id = f"req-{k}"
        d = p.place(r)  # type: ignore[attr-defined]
        if d.ok:
            assert all(pool.gpu(x.gpu_uuid).health != "cordoned" for x in d.placements)
        assert_pool_is_legal(pool)


@SETTINGS
@given(nodes=pools(), stream=st.lists(requests, min_size=1, max_size=10))
def test_indexes_match_a_rebuild_after_any_sequence_of_places_and_releases(nodes, stream):
    pool = Pool(nodes)
    s = Scheduler(pool)
    for k, r in enumerate(stream):
        r.lease_id = f"req-{k}"
        if s.place(r).ok and k % 3 == 0:
            pool.release_lease(r.lease_id)
    rebuilt = Pool(list(pool.nodes.values()))
    for a, b in zip(pool.records, rebuilt.records):
        assert (a.avail, a.layout, a.free_frac) == (b.avail, b.layout, b.free_frac)
    assert {k: sorted(v) for k, v in pool.leases.items()} == {k: sorted(v) for k, v in rebuilt.leases.items()}
    assert all(pool.node_free[k] == rebuilt.node_free[k] for k in pool.nodes)
    assert {k: dict(v) for k, v in pool.node_groups.items()} == {k: dict(v) for k, v in rebuilt.node_groups.items()}
    assert abs(pool.free_share() - rebuilt.free_share()) < 1e-9

    assert_walk_indexes_match(pool, rebuilt)
    assert {k: v for k, v in pool.nodes_by_kind_pfree.items() if v and k[1]} == \
        {k: v for k, v in rebuilt.nodes_by_kind_pfree.items() if v and k[1]}  # (model, count > 0)
    assert pool.max_key >= max(r.key for r in pool.records)


def assert_walk_indexes_match(pool: Pool, rebuilt: Pool) -> None:
    """The fast path's indexes (in static and in spot order) equal those of a pool built afresh."""
    def avail(index):
        return {(k, region): lst for k, by_region in index.items() for region, lst in by_region.items() if lst}

    def layouts(index):  # by_layout[(model, profile)][layout][region]; emptied lists and buckets are removed
        return {(k, lay, region): lst for k, b in index.items() for lay, by_region in b.items()
                for region, lst in by_region.items()}

    for a, b in ((pool.avail, rebuilt.avail), (pool.avail_spot, rebuilt.avail_spot)):
        assert avail(a) == avail(b)
    for a, b in ((pool.by_layout, rebuilt.by_layout), (pool.by_layout_spot, rebuilt.by_layout_spot)):
        assert layouts(a) == layouts(b) and all(layouts(a).values())
    assert pool.max_skey >= max(r.skey for r in pool.records)
    for r in pool.records:
        assert pool.model_max_key[r.gpu.model] >= r.key and pool.model_max_skey[r.gpu.model] >= r.skey
