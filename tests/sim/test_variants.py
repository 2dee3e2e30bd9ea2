"""Trace and pool variants (scheduler/sim/variants.py) and the capacity bound (scheduler/sim/bound.py)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from scheduler.sim.bound import allocation_bound
from scheduler.sim.cli import main
from scheduler.sim.mapping import demand_for
from scheduler.sim.policies import factory
from scheduler.sim.report import summarise
from scheduler.sim.run import DEFAULT_TRACE, DEFAULT_TRACE_DIR, SimConfig, capacity_bound, prepare, run_policy
from scheduler.sim.simulate import Job
from scheduler.sim.trace import Pod
from scheduler.sim.variants import (NodeVariant, PodVariant, measured_shares, resample_pods,
                                    variant_nodes)

DEFAULT = DEFAULT_TRACE_DIR / DEFAULT_TRACE
needs_trace = pytest.mark.skipif(not DEFAULT.exists(), reason="openb traces not present")


def _pods(n: int = 1000) -> list[Pod]:
    """A base pod list: a third sharing (milli 100..900), a few 8-GPU pods, the rest whole single GPUs."""
    out = []
    for i in range(n):
        if i % 3 == 0:
            shape = (1, 100 + (i % 9) * 100)
        elif i % 50 == 1:
            shape = (8, 1000)
        else:
            shape = (1, 1000)
        out.append(Pod(f"p{i}", shape[0], shape[1], (), "LS", float(i * 10), 100.0 + i))
    return out


@pytest.mark.parametrize("variant", [
    PodVariant(share=0.6, spec=0.2, multi=0.3, seed=7),
    PodVariant(share=0.0, multi=0.0, seed=1),
    PodVariant(share=0.9, seed=2),
    PodVariant(spec=0.33, seed=3),
    PodVariant(multi=0.2, seed=4),
])
def test_variant_shares_hold_within_a_pod(variant):
    base = _pods()
    got = measured_shares(resample_pods(base, variant))
    before = measured_shares(base)
    for name in ("share", "spec", "multi"):
        want = getattr(variant, name)
        # a share left out stays as in the base (both shares here leave room for each other)
        assert got[name] == pytest.approx(before[name] if want is None else want, abs=1.5 / len(base)), name


def test_a_given_share_wins_over_the_base_share_it_leaves_no_room_for():
    got = measured_shares(resample_pods(_pods(), PodVariant(share=1.0, seed=2)))
    assert (got["share"], got["multi"]) == (1.0, 0.0)


def test_a_variant_keeps_every_pods_timing_qos_and_order():
    base = _pods()
    out = resample_pods(base, PodVariant(share=0.5, spec=0.5, multi=0.25, seed=9))
    assert [(p.name, p.arrival, p.runtime, p.qos) for p in out] == [(p.name, p.arrival, p.runtime, p.qos)
                                                                    for p in base]


def test_a_variant_draws_shapes_from_the_base_trace():
    base = _pods()
    out = resample_pods(base, PodVariant(share=0.5, multi=0.3, seed=5))
    assert {p.gpu_milli for p in out if p.num_gpu == 1 and p.gpu_milli < 1000} <= {p.gpu_milli for p in base}
    assert {p.num_gpu for p in out if p.num_gpu > 1} == {8}  # the base's only multi-GPU shape
    assert all(p.gpu_milli == 1000 for p in out if p.num_gpu > 1)


def test_pinned_pods_name_the_public_familys_models():
    out = resample_pods(_pods(), PodVariant(spec=0.5, seed=3))
    pins = Counter(s for p in out for s in p.gpu_spec)
    assert set(pins) <= {"T4", "G2", "P100", "V100M16", "V100M32", "G3", "A10"}
    assert pins.most_common(1)[0][0] == "T4"  # as in openb_pod_list_gpuspec33.csv


def test_a_variant_is_seeded():
    base = _pods()
    v = PodVariant(share=0.6, spec=0.2, multi=0.3, seed=7)
    assert resample_pods(base, v) == resample_pods(base, v)
    assert resample_pods(base, v) != resample_pods(base, PodVariant(share=0.6, spec=0.2, multi=0.3, seed=8))


@pytest.mark.parametrize("text, message", [
    ("share=1.2", "between 0 and 1"),
    ("share=0.7,multi=0.5", "more than all"),
    ("shares=0.5", "KEY one of"),
    ("share=lots", "not a number"),
])
def test_a_bad_variant_is_refused_with_its_reason(text, message):
    with pytest.raises(ValueError, match=message):
        PodVariant.parse(text)


def test_the_cli_refuses_a_bad_variant_without_a_traceback(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--variant", "share=2"])
    assert exc.value.code == 2
    assert "between 0 and 1" in capsys.readouterr().err


@pytest.mark.parametrize("v, by_model", [
    (NodeVariant(gpus=400, big=0.6, h100=0.35, l4=0.3), {"h100-80gb": (10, 8), "a100-80gb": (20, 8),
                                                         "l4": (48, 1), "a10": (112, 1)}),
    (NodeVariant(gpus=64, big=1.0, h100=0.5), {"h100-80gb": (4, 8), "a100-80gb": (4, 8)}),
    (NodeVariant(gpus=10, big=0.0, l4=0.5), {"l4": (5, 1), "a10": (5, 1)}),
])
def test_node_variant_composition(v, by_model):
    specs = variant_nodes(v)
    got: dict[str, list[int]] = {}
    for s in specs:
        got.setdefault(s.model, []).append(s.gpus)
    assert {m: (len(g), g[0]) for m, g in got.items()} == by_model
    assert sum(s.gpus for s in specs) == v.gpus
    assert len({s.id for s in specs}) == len(specs)


def test_node_variant_order_is_seeded():
    a, b = variant_nodes(NodeVariant(seed=1)), variant_nodes(NodeVariant(seed=2))
    assert a == variant_nodes(NodeVariant(seed=1))
    assert a != b and sorted(s.id for s in a) == sorted(s.id for s in b)


def test_old_cards_pinned_pods_map_onto_a_node_variants_small_servers():
    cfg = SimConfig(nodes_variant=NodeVariant(gpus=16))
    mapping = cfg.effective_model_map()
    assert demand_for(1, 200, ("T4",), "LS", mapping=mapping).models == frozenset({"l4"})
    # an explicit --model-map entry still wins
    cfg = SimConfig(nodes_variant=NodeVariant(gpus=16), model_map={**cfg.model_map, "T4": "a10"})
    assert cfg.effective_model_map()["T4"] == "a10"


# --- the capacity bound ----------------------------------------------------------------------------


def _job(i: int, arrival: float, runtime: float, share: float) -> Job:
    num_gpu, milli = (int(share), 1000) if share >= 1 else (1, int(share * 1000))
    pod = Pod(f"j{i}", num_gpu, milli, (), "LS", arrival, runtime)
    return Job(i, pod, demand_for(num_gpu, milli, (), "LS", mapping={}), arrival)


@pytest.mark.parametrize("jobs, capacity, window, bound", [
    # one 1-GPU job over the whole window on 2 GPUs: half the pool at most
    ([(0, 100, 1)], 2, (0, 100), 0.5),
    # four 1-GPU jobs from 0 to 100 on 2 GPUs: the pool is the limit
    ([(0, 100, 1)] * 4, 2, (0, 100), 1.0),
    # a job arriving at 50 for 100 s: at most 50 s of it fits before the window closes
    ([(50, 100, 1)], 1, (0, 100), 0.5),
    # an early short job may be held back into the window: it still counts its full runtime
    ([(0, 10, 1)], 1, (20, 120), 0.1),
    # a job arriving after the window adds nothing
    ([(200, 10, 1)], 1, (0, 100), 0.0),
])
def test_the_bound_by_hand(jobs, capacity, window, bound):
    js = [_job(i, a, r, s) for i, (a, r, s) in enumerate(jobs)]
    assert allocation_bound(js, capacity, window) == pytest.approx(bound)


def test_jobs_that_fit_nowhere_are_left_out_of_the_bound():
    js = [_job(0, 0, 100, 1), _job(1, 0, 100, 8)]
    assert allocation_bound(js, 2, (0, 100), fits=lambda j: j.demand.gpu_count <= 2) == pytest.approx(0.5)


@needs_trace
@pytest.mark.parametrize("kw", [
    dict(variant=PodVariant(share=0.6, spec=0.2, multi=0.15, seed=7)),
    dict(nodes_variant=NodeVariant(gpus=48, seed=3)),
])
def test_no_policy_beats_the_bound(kw):
    cfg = SimConfig(trace=DEFAULT, limit=1500, load=8, **kw)
    prepared = prepare(cfg)
    bound = capacity_bound(prepared)
    for name in ("best-fit", "first-fit", "ours"):
        alloc = summarise(run_policy(prepared, name, factory(name)))["allocation"]
        assert 0 < alloc <= bound + 1e-9, name


@needs_trace
def test_the_cli_replays_a_variant_on_a_variant_pool(capsys, tmp_path: Path):
    rc = main(["--limit", "600", "--load", "8", "--policies", "best-fit,ours", "--quiet",
               "--variant", "share=0.6,multi=0.1,seed=7", "--nodes-variant", "gpus=24,seed=1",
               "--json", str(tmp_path / "out.json")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "variant share=0.6,multi=0.1,seed=7: pod shapes redrawn" in out
    assert "pool variant gpus=24" in out
    assert "bound: no policy can average more than" in out
