"""The tune-on / report-on harness (scheduler/sim/generalise.py)."""
from __future__ import annotations

import pytest

from scheduler.sim import generalise as G
from scheduler.sim.run import DEFAULT_TRACE, DEFAULT_TRACE_DIR
from scheduler.sim.variants import NodeVariant, PodVariant


def test_a_second_seed_is_the_same_case_drawn_again():
    c = G.Case("x", variant=PodVariant(share=0.7, seed=1), nodes_variant=NodeVariant(gpus=24, seed=1))
    b = c.reseeded(9)
    assert b.name == "xb" and b.variant == PodVariant(share=0.7, seed=9)
    assert b.nodes_variant == NodeVariant(gpus=24, seed=9) and G.Case("y").reseeded(3) == G.Case("yb")


def test_nothing_reported_on_was_tuned_on():
    tuned = {(c.trace, c.variant, c.nodes_variant) for c in G.TUNE_ON}
    reported = {(c.trace, c.variant, c.nodes_variant) for c in G.REPORT_ON}
    assert not tuned & reported
    seeds = lambda cases: {v.seed for c in cases for v in (c.variant, c.nodes_variant) if v}  # noqa: E731
    assert not seeds(G.TUNE_ON) & seeds(G.REPORT_ON)  # not even a seed is shared
    assert len({c.name for c in G.TUNE_ON + G.REPORT_ON}) == len(G.TUNE_ON) + len(G.REPORT_ON)
    # the screening cases are tuning data too: nothing of them is reported on either
    screened = {(c.trace, c.variant, c.nodes_variant) for c in G.SCREEN_ON}
    assert not screened & reported and not seeds(G.SCREEN_ON) & seeds(G.REPORT_ON)
    assert not seeds(G.SCREEN_ON) & seeds(G.TUNE_ON)
    every = G.TUNE_ON + G.SCREEN_ON + G.REPORT_ON
    assert len({c.name for c in every}) == len(every)
    # a family (--seeds) is drawn from seeds none of the three sets uses, and a tuning case's family never
    # shares a seed with a reported case's: the same seed under nearby shares would draw nearly the same pods
    reported_f, tuning_f = set(G.family_seeds(G.FAMILY_MAX)), set(G.family_seeds(G.FAMILY_MAX, tuning=True))
    assert not (reported_f | tuning_f) & seeds(every) and not reported_f & tuning_f
    assert {G.family_of(c, 3) for c in G.TUNE_ON + G.SCREEN_ON} == {(201, 202, 203)}
    assert {G.family_of(c, 3) for c in G.REPORT_ON} == {(101, 102, 103)}


def test_cases_that_differ_only_in_their_seed_are_one_family():
    kept, dropped = G.distinct_families(G.TUNE_ON + G.SCREEN_ON + G.REPORT_ON)
    names = [c.name for c in kept]
    assert "share70" in names and "share70b" not in names and "modern-cb" not in names
    assert dropped[0] == "  share70b: the same family as share70 (only its seed differs), not run again"
    assert len(kept) == 5 + 5 + 6 and len(dropped) == 5  # TUNE_ON's second seeds
    # a reported family is never merged into a tuning one of the same shares (their seeds differ), but a second
    # reported case of the same shares is the same family
    twin = G.Case("share85-again", variant=PodVariant(share=0.85, seed=99))
    kept = [c.name for c in G.distinct_families([*G.SCREEN_ON, *G.REPORT_ON, twin])[0]]
    assert "share85t" in kept and "share85" in kept and "share85-again" not in kept


def test_a_family_has_one_to_fifty_seeds_and_the_command_line_says_so(capsys):
    assert G.family_seeds(3) == (101, 102, 103)
    for bad in (0, G.FAMILY_MAX + 1):
        with pytest.raises(ValueError, match="1 to 50 seeds"):
            G.family_seeds(bad)
    for argv, says in [(["--seeds", "51"], "--seeds is 1 to 50"), (["--seeds", "2", "--tune"], "not --tune")]:
        with pytest.raises(SystemExit) as e:
            G.main(argv)
        assert e.value.code == 2 and says in capsys.readouterr().err


def _s(alloc=0.5, frag=0.01, p99=100.0):
    return {"allocation": alloc, "fragmentation": frag, "wait_p99_s": p99}


@pytest.mark.parametrize("ours, misses", [
    (_s(), []),
    (_s(alloc=0.6, frag=0.005, p99=0.0), []),
    (_s(alloc=0.5 - G.ALLOC_TOLERANCE / 2), []),  # a few jobs' worth of allocation is noise
    (_s(frag=0.012), ["frag +0.0020"]),
    (_s(alloc=0.49), ["alloc -1.00%"]),
    (_s(p99=3700.0), ["p99 +1.0h"]),
    (_s(alloc=0.4, frag=0.02, p99=200.0), ["frag +0.0100", "alloc -10.00%", "p99 +1.7m"]),
])
def test_a_run_is_judged_against_best_fit_on_all_three(ours, misses):
    assert G.verdict(ours, _s()) == misses
    if misses:
        assert G.loss(ours, _s()) > 0
    elif ours["allocation"] >= 0.5:
        assert G.loss(ours, _s()) == 0


def test_the_loss_grows_with_each_shortfall():
    base = G.loss(_s(frag=0.012), _s())
    assert G.loss(_s(frag=0.014), _s()) > base > 0
    assert G.loss(_s(frag=0.012, p99=7300.0), _s()) > base


@pytest.mark.skipif(not (DEFAULT_TRACE_DIR / DEFAULT_TRACE).exists(), reason="openb traces not present")
def test_a_case_runs_every_policy_beside_the_bound():
    case = G.Case("tiny", variant=PodVariant(share=0.7, seed=1), nodes_variant=NodeVariant(gpus=24, seed=1))
    run = G.run_case(case, 8.0, G.fixed_and_adaptive(), limit=400)
    assert set(run["policies"]) == {"best-fit", "bf-reordered", "ours", "ours-fixed", "ours-adaptive"}
    assert run["gpus"] == 24
    for s in run["policies"].values():
        assert 0 < s["allocation"] <= run["bound"] + 1e-9
    lines = G.report_lines([run])
    assert len(lines) == 2 + 5 and "tiny" in lines[2]


@pytest.mark.skipif(not (DEFAULT_TRACE_DIR / DEFAULT_TRACE).exists(), reason="openb traces not present")
def test_a_node_order_is_the_same_pool_shuffled_and_moves_only_tie_breaks():
    from scheduler.sim.run import prepare

    case = G.Case("tiny", variant=PodVariant(share=0.7, seed=1), nodes_variant=NodeVariant(gpus=24, seed=1))
    built = prepare(case.config(load=8.0, limit=400))
    again, other = (prepare(case.config(load=8.0, limit=400, node_order=o)) for o in (5, 6))
    by_id = lambda p: sorted(p.node_specs, key=lambda n: n.id)  # noqa: E731
    assert by_id(built) == by_id(again) == by_id(other)
    assert again.node_specs == prepare(case.config(load=8.0, limit=400, node_order=5)).node_specs  # seeded
    assert again.node_specs != built.node_specs != other.node_specs
    assert [j.arrival for j in again.jobs] == [j.arrival for j in built.jobs]  # the same arrivals
    assert "node order shuffled with seed 5" in again.notes


@pytest.mark.skipif(not (DEFAULT_TRACE_DIR / DEFAULT_TRACE).exists(), reason="openb traces not present")
def test_over_several_node_orders_a_run_is_judged_on_the_means():
    case = G.Case("tiny", variant=PodVariant(share=0.7, seed=1), nodes_variant=NodeVariant(gpus=24, seed=1))
    policies = {"best-fit": G.factory("best-fit"), "bf-reordered": G.reordered_best_fit(), "ours": G.ours()}
    merged = G.run_case(case, 8.0, policies, limit=400, orders=3)
    singles = [G.run_case(case, 8.0, policies, limit=400)]  # the pool as built
    from scheduler.sim.run import prepare, run_policy
    from scheduler.sim.report import summarise
    for order in (1, 2):
        prepared = prepare(case.config(load=8.0, limit=400, node_order=order))
        singles.append({"policies": {n: summarise(run_policy(prepared, n, f)) for n, f in policies.items()}})
    for name in policies:
        for key in G.MEANS:
            assert merged["policies"][name][key] == pytest.approx(
                sum(r["policies"][name][key] for r in singles) / 3)
        assert merged["passes"][name] == sum(
            not G.verdict(r["policies"][name], r["policies"]["best-fit"]) for r in singles)
    assert merged["orders"] == 3 and merged["passes"]["best-fit"] == 3
    for name in policies:  # paired on each order: the mean difference is the difference of the means
        mean, _ = merged["paired"][name]["fragmentation"]
        assert mean == pytest.approx(merged["policies"][name]["fragmentation"]
                                     - merged["policies"]["best-fit"]["fragmentation"])
    assert merged["paired"]["best-fit"]["allocation"] == (0.0, 0.0) and not G.clearly_behind(merged, "best-fit")
    line = next(x for x in G.report_lines([merged]) if " ours " in x)
    assert f"as good on {merged['passes']['ours']} of 3 orders alone" in line


@pytest.mark.skipif(not (DEFAULT_TRACE_DIR / DEFAULT_TRACE).exists(), reason="openb traces not present")
def test_a_family_is_every_seed_on_every_order_paired_replay_by_replay():
    case = G.Case("tiny", variant=PodVariant(share=0.7, seed=1), nodes_variant=NodeVariant(gpus=24, seed=1))
    policies = {"best-fit": G.factory("best-fit"), "ours": G.ours()}
    family = G.run_family(case, 8.0, policies, limit=300, seeds=(5, 6), orders=2)
    members = [G.run_case(case.reseeded(seed), 8.0, policies, limit=300, orders=2) for seed in (5, 6)]
    assert family["case"] == "tiny" and family["seeds"] == (5, 6) and family["orders"] == 4
    for name in policies:
        for key in G.MEANS:  # the mean over the four replays is the mean of the two seeds' means
            assert family["policies"][name][key] == pytest.approx(
                sum(m["policies"][name][key] for m in members) / 2)
        assert family["passes"][name] == sum(m["passes"][name] for m in members)
    mean, _ = family["paired"]["ours"]["fragmentation"]
    assert mean == pytest.approx(family["policies"]["ours"]["fragmentation"]
                                 - family["policies"]["best-fit"]["fragmentation"])
    assert family["bound"] == pytest.approx(sum(m["bound"] for m in members) / 2)
    line = next(x for x in G.report_lines([family]) if " ours " in x)
    assert line.startswith("tiny×2 ") and "of 4 replays (2 seeds × 2 orders) alone" in line
    # the seeds change the arrivals: a family is not one case replayed four times
    assert members[0]["policies"]["best-fit"] != members[1]["policies"]["best-fit"]
    # a public file without a variant has no family: it runs as run_case runs it
    public = G.Case("multigpu20", trace="openb_pod_list_multigpu20.csv")
    alone = G.run_family(public, 8.0, policies, limit=200, seeds=(5, 6))
    again = G.run_case(public, 8.0, policies, limit=200)
    assert "seeds" not in alone and alone["case"] == "multigpu20" and "orders" not in alone
    assert all(alone["policies"][n][k] == again["policies"][n][k] for n in policies for k in G.MEANS)


def test_requests_are_split_into_the_three_kinds_the_attribution_swaps():
    from scheduler.core.model import Request
    assert G.request_kind(Request(memory_gb=80, whole_gpu=True)) == "whole"
    assert G.request_kind(Request(memory_gb=80, whole_gpu=True, gpu_count=4)) == "multi"
    assert G.request_kind(Request(memory_gb=10)) == "slice"


@pytest.mark.skipif(not (DEFAULT_TRACE_DIR / DEFAULT_TRACE).exists(), reason="openb traces not present")
def test_handing_every_kind_to_best_fit_in_turn_runs_beside_both():
    case = G.Case("tiny", variant=PodVariant(share=0.5, multi=0.2, seed=1), nodes_variant=NodeVariant(gpus=24, seed=1))
    run = G.run_case(case, 8.0, G.attribution(), limit=300)
    assert set(run["policies"]) == {"best-fit", "ours", "bf-whole", "bf-multi", "bf-slice"}
    for s in run["policies"].values():
        assert 0 < s["allocation"] <= run["bound"] + 1e-9


def test_an_unknown_case_name_is_refused_with_the_known_ones(capsys):
    with pytest.raises(SystemExit):
        G.main(["--cases", "share85,nope"])
    err = capsys.readouterr().err
    assert "unknown case nope" in err and "share85" in err


def test_a_candidate_constant_is_set_for_the_run_and_bad_ones_are_refused(monkeypatch):
    from scheduler.core import fragmentation, placement
    monkeypatch.setattr(placement, "GANG_KEEP_PER_GPU", placement.GANG_KEEP_PER_GPU)
    monkeypatch.setattr(fragmentation, "FIT_WEIGHT", fragmentation.FIT_WEIGHT)
    assert G.apply_settings(["placement.GANG_KEEP_PER_GPU=0.5", "fragmentation.FIT_WEIGHT=0.2"]) == {
        "placement.GANG_KEEP_PER_GPU": 0.5, "fragmentation.FIT_WEIGHT": 0.2}
    assert placement.GANG_KEEP_PER_GPU == 0.5 and fragmentation.FIT_WEIGHT == 0.2
    for bad, says in [("placement.GANG_KEEP_PER_GPU", "MODULE.CONSTANT=NUMBER"),
                      ("nomodule.X=1", "no module 'nomodule'"),
                      ("placement.NOPE=1", "no numeric constant NOPE"),
                      ("placement.gang_keep=1", "MODULE.CONSTANT=NUMBER"),
                      ("placement.GANG_KEEP_PER_GPU=lots", "'lots' is not a number"),
                      ("placement.MILLI_PACK_GPUS=2.5", "is a whole number")]:
        with pytest.raises(ValueError, match=says):
            G.apply_settings([bad])
    with pytest.raises(ValueError):
        G.apply_settings(["placement.GANG_KEEP_PER_GPU=0.9", "placement.NOPE=1"])
    assert placement.GANG_KEEP_PER_GPU == 0.5  # a refused list changes nothing


def test_case_groups_expand_and_a_bad_setting_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        G.main(["--cases", "TUNE_ON,nope"])
    assert e.value.code == 2 and "unknown case nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        G.main(["--set", "placement.NOPE=1"])
    assert e.value.code == 2 and "no numeric constant NOPE" in capsys.readouterr().err


@pytest.mark.skipif(not (DEFAULT_TRACE_DIR / DEFAULT_TRACE).exists(), reason="openb traces not present")
def test_running_tuned_on_cases_does_not_call_them_reported(capsys):
    assert G.main(["--cases", "modern-c", "--limit", "300"]) == 0
    out = capsys.readouterr().out
    assert "running (some of these are tuned on):" in out and "reported on:" not in out
    assert G.main(["--cases", "SCREEN_ON", "--limit", "200", "--policies", "ours"]) == 0
    out = capsys.readouterr().out
    assert "running (some of these are tuned on):" in out and "reported on:" not in out and "share90t" in out
    # a reported run names both sets it was not judged on
    assert G.main(["--cases", "multigpu20", "--limit", "200", "--policies", "ours"]) == 0
    out = capsys.readouterr().out
    tuned, screened, reported = (out.index(h) for h in ("tuned on (not reported):", "screened on (not reported):",
                                                         "reported on:"))
    assert tuned < out.index("share70") < screened < out.index("share90t") < reported < out.index("multigpu20")


@pytest.mark.skipif(not (DEFAULT_TRACE_DIR / DEFAULT_TRACE).exists(), reason="openb traces not present")
def test_policies_picks_which_run_beside_best_fit_and_an_unknown_one_is_a_usage_error(capsys):
    assert G.main(["--cases", "modern-c", "--limit", "300", "--policies", "ours"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[3] for line in out.splitlines() if line.startswith("modern-c ")]
    assert rows == ["best-fit", "ours", "best-fit", "ours"]  # x4 and x8, nothing else
    assert "  ours: as good as best-fit on" in out and "bf-reordered" not in out
    with pytest.raises(SystemExit) as e:
        G.main(["--cases", "modern-c", "--policies", "ours,nope"])
    assert e.value.code == 2 and "unknown policy nope" in capsys.readouterr().err


def test_behind_beyond_noise_needs_the_paired_mean_outside_its_95_percent_interval():
    assert G.paired([0.001, 0.001, 0.001]) == (pytest.approx(0.001), 0.0)
    mean, half = G.paired([0.003, -0.001, 0.001, -0.003])
    assert mean == 0.0 and half == pytest.approx(3.18 * (0.00002 / 3 / 4) ** 0.5)  # t on 3 degrees of freedom
    assert G.paired([0.002]) == (0.002, 0.0)

    def run(frag, alloc=(0.0, 0.0), p99=(0.0, 0.0)):
        return {"orders": 4, "paired": {"ours": {"fragmentation": frag, "allocation": alloc, "wait_p99_s": p99}}}
    assert G.clearly_behind(run((0.0004, 0.0001)), "ours") == ["frag +0.0004±0.0001"]
    assert G.clearly_behind(run((0.0004, 0.0006)), "ours") == []  # within the orders' noise
    assert G.clearly_behind(run((0.0, 0.0), alloc=(-0.0005, 0.0001)), "ours") == []  # within ALLOC_TOLERANCE
    assert G.clearly_behind(run((0.0, 0.0), alloc=(-0.004, 0.001)), "ours") == ["alloc -0.40%±0.10%"]
    assert G.clearly_behind(run((-0.001, 0.0), p99=(7200.0, 600.0)), "ours") == ["p99 +2.0h±10.0m"]
    assert G.clearly_behind({"policies": {}}, "ours") == []  # one order: nothing to judge noise by
    one = run((0.0004, 0.0))  # a family of one seed on one order is a single replay too
    one["orders"] = 1
    assert G.clearly_behind(one, "ours") == []
    # a report whose first run is a public file on one order still counts the families behind beyond noise
    public = {"case": "p", "load": 4.0, "policies": {"best-fit": _s(), "ours": _s()}}
    family = {**run((0.0004, 0.0001)), "case": "f", "load": 4.0, "seeds": (101, 102),
              "policies": {"best-fit": _s(), "ours": _s(frag=0.0104)}}
    assert G.summary_lines([public, family])[0].endswith(
        "behind beyond the noise of their replays (2 seeds of each variant case) on 1")
