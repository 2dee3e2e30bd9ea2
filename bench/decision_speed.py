"""Scheduler decision speed: the fast (indexed) path beside the exhaustive reference, in one run.

    .venv/bin/python bench/decision_speed.py          # pools of 1,000, 10,000 and 50,000 GPUs
    .venv/bin/python bench/decision_speed.py --quick  # a small run (1,000 and 10,000 GPUs, fewer decisions)

Pools mix MIG and whole-GPU models in 8-GPU nodes across regions, with about half the MIG capacity in use
(random legal layouts) and half the whole GPUs busy. Requests mix slices, whole GPUs, k GPUs on one node,
model/region/CUDA constraints and spot. Decisions are `decide` only (pure), so the pool stays as built.
Targets (issue 3): >= 2,000 decisions/s at 10,000 GPUs on one core; fast >= 20x the exhaustive reference
with a score within 1%; fast p99 growing < 2x from 1,000 to 10,000 GPUs.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nodeagent.hardware import mig  # noqa: E402
from scheduler.core.engine import Pool, Scheduler  # noqa: E402
from nodeagent.hardware.gpus import GPU_MODELS  # noqa: E402
from scheduler.core.model import GpuState, NodeState, PlacedInstance, Request  # noqa: E402
from scheduler.core.regions import REGIONS  # noqa: E402

# model -> (share of nodes, base $ per GPU-hour)
MODEL_MIX = {
    "a100-80gb": (0.22, 1.6), "h100-80gb": (0.20, 2.5), "a100-40gb": (0.08, 1.2), "h200-141gb": (0.06, 3.4),
    "h100-nvl-94gb": (0.04, 2.7), "a30-24gb": (0.05, 0.6), "l40s": (0.10, 0.9), "l4": (0.10, 0.45),
    "a10": (0.07, 0.5), "rtx-4090": (0.04, 0.4), "t4": (0.02, 0.2), "v100": (0.02, 0.35),
}
CUDA = ("12.2", "12.4", "12.6")


def fill_half(rng: random.Random, g: mig.MigGeometry) -> list[PlacedInstance]:
    """A random legal layout using about half the GPU on average (uniform target per GPU)."""
    target = rng.random()
    insts: list[mig.Instance] = []
    plain = [p for p in g.profiles if not p.media_extensions]
    for _ in range(20):
        free_mem, _ = mig.free_capacity(g, insts)
        if 1 - free_mem / g.memory_slices >= target:
            break
        p = rng.choice(plain)
        starts = mig.legal_starts(g, insts, p.name)
        if starts:
            insts.append(mig.Instance(p.name, rng.choice(starts)))
    return [PlacedInstance(i.profile, i.start, f"bg-{id(insts)}-{n}", rng.choice(("on_demand", "spot")),
                           rng.uniform(1, 50)) for n, i in enumerate(insts)]


def build_nodes(n_gpus: int, seed: int) -> list[NodeState]:
    rng = random.Random(seed)
    models, shares = zip(*((m, s) for m, (s, _) in MODEL_MIX.items()))
    nodes = []
    while sum(len(n.gpus) for n in nodes) < n_gpus:
        model = rng.choices(models, shares)[0]
        nid = f"n{len(nodes)}"
        spec = GPU_MODELS[model]
        node = NodeState(id=nid, region=rng.choice(REGIONS), cuda_version=rng.choice(CUDA),
                         price_per_gpu_hour=round(MODEL_MIX[model][1] * rng.uniform(0.8, 1.25), 2),
                         reliability=round(rng.uniform(0.95, 0.999), 3),
                         interruption_rate=round(rng.uniform(0.0, 0.3), 2))
        for j in range(8):
            mig_on = spec.mig is not None and rng.random() < 0.9
            g = GpuState(uuid=f"{nid}-g{j}", node_id=nid, model=model, geometry=spec.mig if mig_on else None)
            if mig_on:
                g.instances = fill_half(rng, spec.mig)  # type: ignore[arg-type]
            elif rng.random() < 0.5:
                g.instances = [PlacedInstance(None, 0, f"bg-{nid}-{j}", "on_demand", 10.0)]
            node.gpus.append(g)
        nodes.append(node)
    return nodes


def make_requests(n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    mig_models = [m for m, s in GPU_MODELS.items() if s.mig]
    out = []
    for _ in range(n):
        kind = rng.random()
        models = None
        if rng.random() < 0.4:
            models = frozenset(rng.sample(list(MODEL_MIX), rng.choice((1, 2, 3))))
        common = dict(models=models, buyer_region=rng.choice(REGIONS),
                      mode=rng.choices(("on_demand", "spot", "reserved"), (0.6, 0.25, 0.15))[0],
                      min_cuda=rng.choice((None, None, "12.4")))
        if kind < 0.70:
            if models is None and rng.random() < 0.5:
                common["models"] = frozenset(rng.sample(mig_models, 2))
            out.append(Request(memory_gb=rng.choice((5, 10, 10, 20, 20, 40, 70)),
                               compute_slices=rng.choice((1, 1, 2, 3)), **common))
        elif kind < 0.92:
            out.append(Request(whole_gpu=True, memory_gb=rng.choice((16, 24, 40, 80)), **common))
        else:
            out.append(Request(gpu_count=rng.choice((2, 4, 8)), **common))
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_size(n_gpus: int, n_fast: int, n_exh: int, seed: int = 1) -> dict:
    try:
        return _run_size(n_gpus, n_fast, n_exh, seed)
    finally:
        gc.unfreeze()


def _run_size(n_gpus: int, n_fast: int, n_exh: int, seed: int) -> dict:
    pool = Pool(build_nodes(n_gpus, seed))
    warm = make_requests(300, seed + 7)
    for r in warm:
        pool.mix.observe(r)
    pool.mix.refresh()
    fast, exh = Scheduler(pool, mode="fast"), Scheduler(pool, mode="exhaustive")
    for r in warm[:200]:  # fill the placement caches: they are per layout and persist in a real service
        fast.decide(r)
    reqs = make_requests(n_fast, seed + 11)
    # The pool's objects live as long as the service: keep the cyclic GC from rescanning them (a full
    # collection over a 50,000-GPU pool takes ~0.3 s and, landing among the few timed exhaustive-comparison
    # decisions, swung the reported speedup from ~500x to 8x between runs). A service would do the same
    # after loading its snapshot.
    gc.collect()
    gc.freeze()
    lat_fast, cpu_lat, decisions = [], [], []
    t_all, cpu_all = time.perf_counter(), time.process_time()
    for r in reqs:
        t, c = time.perf_counter(), time.process_time()
        decisions.append(fast.decide(r))
        lat_fast.append(time.perf_counter() - t)
        cpu_lat.append(time.process_time() - c)
    total_fast = time.perf_counter() - t_all
    cpu_fast = time.process_time() - cpu_all  # CPU seconds of this process: less hurt by a shared machine
    # placed = fitted without preemption (the indexed path); the rest also count every GPU's refusal
    # reason and plan preemption, which scans the pool's spot capacity
    placed = [t for t, d in zip(lat_fast, decisions) if d.ok and not d.preempt]
    other = [t for t, d in zip(lat_fast, decisions) if not (d.ok and not d.preempt)]
    lat_exh, differ, gaps, ok_mismatch = [], 0, [], 0
    cpu_exh_sum: list[float] = []
    for r, d_fast in list(zip(reqs, decisions))[:n_exh]:
        t, c = time.perf_counter(), time.process_time()
        d_exh = exh.decide(r)
        lat_exh.append(time.perf_counter() - t)
        cpu_exh_sum.append(time.process_time() - c)
        if d_exh.ok != d_fast.ok:
            ok_mismatch += 1
            continue
        if not d_exh.ok:
            continue
        if d_exh.placements != d_fast.placements or d_exh.preempt != d_fast.preempt:
            differ += 1
        if d_exh.preempt or d_fast.preempt:
            continue  # preemption is planned the same way in both modes; its score is not a choice
        rescored = exh.rescore(d_fast, r)
        gaps.append(max(0.0, (d_exh.score - rescored) / d_exh.score) if d_exh.score else 0.0)
    return {
        "gpus": len(pool.records), "n_fast": len(reqs), "n_exh": len(lat_exh),
        "fast_cpu_per_s": len(reqs) / cpu_fast, "cpu_p99": pct(cpu_lat, 0.99),
        "exh_cpu_per_s": len(cpu_exh_sum) / sum(cpu_exh_sum) if cpu_exh_sum else float("nan"),
        "fast_per_s": len(reqs) / total_fast, "fast_p50": pct(lat_fast, 0.5), "fast_p99": pct(lat_fast, 0.99),
        "exh_mean": statistics.mean(lat_exh), "exh_p50": pct(lat_exh, 0.5), "exh_p99": pct(lat_exh, 0.99),
        "fast_mean": statistics.mean(lat_fast[:len(lat_exh)]) if lat_exh else float("nan"),
        # the same ratio in CPU time: one descheduled decision on a shared machine moves the wall-clock mean
        "cpu_speedup": (statistics.mean(cpu_exh_sum) / statistics.mean(cpu_lat[:len(cpu_exh_sum)])
                        if cpu_exh_sum else float("nan")),
        "placed_per_s": len(placed) / sum(placed), "placed_p99": pct(placed, 0.99),
        "other_share": len(other) / len(lat_fast), "other_p50": pct(other, 0.5) if other else 0.0,
        "differ": differ, "ok_mismatch": ok_mismatch, "gaps": gaps,
        "ok_share": sum(d.ok for d in decisions) / len(decisions),
        "free_share": pool.free_share(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small run: 1k and 10k GPUs, fewer decisions")
    args = ap.parse_args()
    plan = ([(1_000, 500, 100), (10_000, 1_000, 40)] if args.quick else
            [(1_000, 3_000, 400), (10_000, 3_000, 150), (50_000, 2_000, 30)])
    rows = []
    print(f"{'GPUs':>7} {'free':>5} {'ok':>5} {'fast/s':>8} {'cpu/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'cpu p99':>8} {'exh/s':>7} "
          f"{'exh p50':>8} {'exh p99':>8} {'speedup':>8} {'cpu x':>7} {'differ':>7} {'gap mean':>9} {'gap max':>8}")
    for n, nf, ne in plan:
        r = run_size(n, nf, ne)
        rows.append(r)
        speedup = r["exh_mean"] / r["fast_mean"]
        gaps = r["gaps"] or [0.0]
        print(f"{r['gpus']:>7} {r['free_share']:>5.2f} {r['ok_share']:>5.2f} {r['fast_per_s']:>8.0f} "
              f"{r['fast_cpu_per_s']:>7.0f} "
              f"{r['fast_p50'] * 1e3:>7.3f} {r['fast_p99'] * 1e3:>7.3f} {r['cpu_p99'] * 1e3:>8.3f} {1 / r['exh_mean']:>7.1f} "
              f"{r['exh_p50'] * 1e3:>8.2f} {r['exh_p99'] * 1e3:>8.2f} {speedup:>7.1f}x {r['cpu_speedup']:>6.1f}x "
              f"{r['differ']:>3}/{r['n_exh']:<3} {statistics.mean(gaps) * 100:>8.2f}% {max(gaps) * 100:>7.2f}%"
              + (f"  ({r['ok_mismatch']} ok/unschedulable mismatches!)" if r["ok_mismatch"] else ""))
    print(f"\n{'GPUs':>7} {'placed/s':>9} {'placed p99 ms':>14} {'unplaced/preempt share':>23} "
          f"{'their p50 ms':>13}")
    for r in rows:
        print(f"{r['gpus']:>7} {r['placed_per_s']:>9.0f} {r['placed_p99'] * 1e3:>14.3f} "
              f"{r['other_share']:>23.2f} {r['other_p50'] * 1e3:>13.2f}")
    r10 = min(rows, key=lambda r: abs(r["gpus"] - 10_000))
    r1 = min(rows, key=lambda r: abs(r["gpus"] - 1_000))
    gaps10 = r10["gaps"] or [0.0]
    print("\nagainst the targets (issue 3):")
    print(f"  decisions/s at {r10['gpus']} GPUs: {r10['fast_per_s']:.0f} wall-clock = {r10['fast_per_s'] / 2000:.2f}x "
          f"the 2,000/s target; {r10['fast_cpu_per_s']:.0f} per CPU-second = "
          f"{r10['fast_cpu_per_s'] / 2000:.2f}x (exhaustive {r10['exh_cpu_per_s']:.1f} per CPU-second)")
    print(f"  fast vs exhaustive at {r10['gpus']} GPUs: {r10['exh_mean'] / r10['fast_mean']:.1f}x "
          f"({r10['cpu_speedup']:.1f}x in CPU time; target >= 20x); mean score gap {statistics.mean(gaps10) * 100:.2f}%, "
          f"max {max(gaps10) * 100:.2f}% (target within 1%)")
    print(f"  decisions/s at {r10['gpus']} GPUs counting only requests that fit without preemption: "
          f"{r10['placed_per_s']:.0f} = {r10['placed_per_s'] / 2000:.2f}x the target")
    print(f"  fast p99 growth {r1['gpus']} -> {r10['gpus']} GPUs: {r10['fast_p99'] / r1['fast_p99']:.2f}x all "
          f"decisions, {r10['placed_p99'] / r1['placed_p99']:.2f}x placed ones, {r10['cpu_p99'] / r1['cpu_p99']:.2f}x "
          f"all decisions in CPU time (target < 2x)")


if __name__ == "__main__":
    main()
