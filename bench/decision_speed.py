"""Scheduler decision speed as ratios: the engine beside a bare linear scan and the exhaustive reference.

    .venv/bin/python bench/decision_speed.py          # pools of 1,000, 10,000, 50,000 and 100,000 GPUs
    .venv/bin/python bench/decision_speed.py --quick  # 1,000, 10,000 and 100,000 GPUs, fewer decisions

Absolute figures move with the machine, so everything that matters is printed as a ratio to something
measured in the same run, in CPU time of this process (`time.process_time`, which other work on a shared
machine disturbs much less than the wall clock):
- the machine's calibration: a fixed pure-Python loop's operations per CPU-second, to compare runs;
- the bare baseline, as issue 12 defines it: a tight linear scan over the same GPU records (the pool's own
  `GpuRecord`s: free share × the model's memory, the node's price) that keeps the cheapest GPU with enough
  free memory — the least any scheduler does, with no filters, no scores, no MIG placement and no reasons;
- an extra line, not the target's baseline: the same scan over a flat list of (free GB, price, index)
  tuples built beforehand and not timed — a scan with its records' reads already done ("tuples");
- ours: `Scheduler.decide` (mode "fast", with refusal reasons) on the same requests, as a ratio to the
  bare scan's decisions per CPU-second (the headline) and to the tuple scan's;
- the exhaustive reference (every filter and scorer on every GPU) on the first requests of the same stream,
  with the fast choice re-scored under it (`Scheduler.rescore`): how often and by how much it scored lower.

Pools mix MIG and whole-GPU models in 8-GPU nodes across regions, with about half the MIG capacity in use
(random legal layouts) and half the whole GPUs busy. Requests mix slices, whole GPUs, k GPUs on one node,
model/region/CUDA constraints and spot. Decisions are `decide` only (pure), so the pool stays as built.
Targets (issue 12): ours >= 3x the bare scan's decisions per CPU-second at 10,000 GPUs; p99 growing < 2x
from 10,000 to 100,000 GPUs; >= 20x the exhaustive mode with every compared decision within 1% of its score.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from typing import Callable

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


def calibrate() -> float:
    """This machine's pure-Python speed: loop iterations per CPU-second of a fixed loop (an add, an and, a
    list index and a dict lookup per iteration), the best of 3 runs. Divide a rate by it to compare runs
    across machines."""
    table, lookup, n, best = list(range(64)), {i: i for i in range(64)}, 400_000, 0.0
    for _ in range(3):
        c = time.process_time()
        acc = 0
        for i in range(n):
            acc += table[i & 63] + lookup[i & 63]
        best = max(best, n / (time.process_time() - c))
    return best


def tuple_scan(gpus: list[tuple[float, float, int]], request: Request) -> int | None:
    """`bare_scan` over (free GB, $ per GPU-hour, pool index) tuples built beforehand: the scan with its
    records' reads already paid for (an extra line; not the issue's baseline)."""
    need, best, best_price = request.memory_gb, None, float("inf")
    for free_gb, price, idx in gpus:
        if free_gb >= need and price < best_price:
            best, best_price = idx, price
    return best


def bare_scan(pool: Pool, request: Request) -> int | None:
    """The least any scheduler does (issue 12's baseline): one pass over the pool's own GPU records keeping
    the cheapest GPU with the request's memory free (free share × the model's memory, the node's price).
    No filters, no scores, no MIG placement, no reasons."""
    need, best, best_price = request.memory_gb, None, float("inf")
    for rec in pool.records:
        if rec.free_frac * rec.spec.memory_gb >= need and rec.node.price_per_gpu_hour < best_price:
            best, best_price = rec.idx, rec.node.price_per_gpu_hour
    return best


CHUNKS = 10


def cpu_of(fn: Callable[[Request], object], reqs: list[Request]) -> float:
    """CPU seconds of `fn` over `reqs`."""
    c = time.process_time()
    for r in reqs:
        fn(r)
    return time.process_time() - c


def run_size(n_gpus: int, n_fast: int, n_exh: int, n_bare: int, seed: int = 1) -> dict:
    try:
        return _run_size(n_gpus, n_fast, n_exh, n_bare, seed)
    finally:
        gc.unfreeze()


def _run_size(n_gpus: int, n_fast: int, n_exh: int, n_bare: int, seed: int) -> dict:
    c_build = time.process_time()
    pool = Pool(build_nodes(n_gpus, seed), copy=False)
    build_s = time.process_time() - c_build
    warm = make_requests(300, seed + 7)
    for r in warm:
        pool.mix.observe(r)
    pool.mix.refresh()
    fast, exh = Scheduler(pool, mode="fast"), Scheduler(pool, mode="exhaustive")
    for r in warm[:200]:  # fill the placement caches: they are per layout and persist in a real service
        fast.decide(r)
    reqs = make_requests(n_fast, seed + 11)
    # the tuple scan's tuples: built once from the records (not timed)
    flat = [(rec.free_frac * rec.spec.memory_gb if rec.schedulable else 0.0, rec.node.price_per_gpu_hour, rec.idx)
            for rec in pool.records]
    # The pool's objects live as long as the service: keep the cyclic GC from rescanning them (a full
    # collection over a 50,000-GPU pool takes ~0.3 s and, landing among the few timed exhaustive-comparison
    # decisions, swung the reported speedup from ~500x to 8x between runs). A service would do the same
    # after loading its snapshot.
    gc.collect()
    gc.freeze()
    # ours and the two scans take turns in CHUNKS slices of their request streams, so that a change in the
    # machine's load during the run weighs on each of them alike (the ratio is what the bench reports)
    cpu_lat, decisions = [], []
    cpu_fast = cpu_bare = cpu_tuples = 0.0
    for part in range(CHUNKS):
        cpu_part = time.process_time()
        for r in reqs[part * len(reqs) // CHUNKS:(part + 1) * len(reqs) // CHUNKS]:
            c = time.process_time()
            decisions.append(fast.decide(r))
            cpu_lat.append(time.process_time() - c)
        cpu_fast += time.process_time() - cpu_part
        scans = reqs[part * n_bare // CHUNKS:(part + 1) * n_bare // CHUNKS]
        cpu_bare += cpu_of(lambda r: bare_scan(pool, r), scans)
        cpu_tuples += cpu_of(lambda r: tuple_scan(flat, r), scans)
    bare_rate, tuples_rate = n_bare / cpu_bare, n_bare / cpu_tuples
    other = [t for t, d in zip(cpu_lat, decisions) if not (d.ok and not d.preempt)]
    cpu_exh, differ, gaps, ok_mismatch = [], 0, [], 0
    for r, d_fast in list(zip(reqs, decisions))[:n_exh]:
        c = time.process_time()
        d_exh = exh.decide(r)
        cpu_exh.append(time.process_time() - c)
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
    ours = len(reqs) / cpu_fast
    return {
        "gpus": len(pool.records), "build_s": build_s, "n_fast": len(reqs), "n_exh": len(cpu_exh),
        "bare": bare_rate, "tuples": tuples_rate, "ours": ours,
        "p50": pct(cpu_lat, 0.5), "p99": pct(cpu_lat, 0.99),
        "exh": len(cpu_exh) / sum(cpu_exh) if cpu_exh else float("nan"),
        # the same requests in both modes: mean exhaustive CPU time ÷ mean fast CPU time
        "exh_x": (statistics.mean(cpu_exh) / statistics.mean(cpu_lat[:len(cpu_exh)]) if cpu_exh
                  else float("nan")),
        "other_share": len(other) / len(cpu_lat), "other_p50": pct(other, 0.5) if other else 0.0,
        "differ": differ, "ok_mismatch": ok_mismatch, "gaps": gaps,
        "ok_share": sum(d.ok for d in decisions) / len(decisions), "free_share": pool.free_share(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1k, 10k and 100k GPUs, fewer decisions (under a minute)")
    ap.add_argument("--sizes", help="comma-separated pool sizes instead of the default plan (e.g. 10000)")
    ap.add_argument("--compare", type=int, help="exhaustive comparisons per size instead of the plan's")
    args = ap.parse_args()
    # (GPUs, fast decisions, exhaustive comparisons, bare-scan decisions)
    plan = ([(1_000, 1_000, 150, 1_000), (10_000, 1_500, 60, 400), (100_000, 1_500, 8, 40)] if args.quick else
            [(1_000, 3_000, 400, 3_000), (10_000, 3_000, 200, 1_000), (50_000, 3_000, 40, 200),
             (100_000, 3_000, 20, 100)])
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
        plan = [next((p for p in plan if p[0] == n), (n, 2_000, 40, max(20, 4_000_000 // n))) for n in sizes]
    if args.compare is not None:
        plan = [(n, nf, args.compare, nb) for n, nf, _, nb in plan]
    calib = calibrate()
    print(f"calibration: {calib / 1e6:.2f} M loop iterations per CPU-second (a fixed pure-Python loop; "
          f"divide a rate by it to compare machines)\n")
    print(f"{'GPUs':>7} {'build s':>7} {'free':>5} {'ok':>5} {'bare/s':>7} {'tuples/s':>8} {'ours/s':>7} "
          f"{'÷bare':>6} {'÷tuples':>7} {'p50 ms':>7} {'p99 ms':>7} {'exh/s':>7} {'÷exh':>7} {'differ':>7} "
          f"{'gap mean':>8} {'gap max':>7} {'>1%':>4}")
    rows = []
    for n, nf, ne, nb in plan:
        r = run_size(n, nf, ne, nb)
        rows.append(r)
        gaps = r["gaps"] or [0.0]
        print(f"{r['gpus']:>7} {r['build_s']:>7.1f} {r['free_share']:>5.2f} {r['ok_share']:>5.2f} {r['bare']:>7.0f} "
              f"{r['tuples']:>8.0f} {r['ours']:>7.0f} {r['ours'] / r['bare']:>5.2f}x {r['ours'] / r['tuples']:>6.2f}x "
              f"{r['p50'] * 1e3:>7.3f} {r['p99'] * 1e3:>7.3f} {r['exh']:>7.1f} {r['exh_x']:>6.1f}x "
              f"{r['differ']:>3}/{r['n_exh']:<3} {statistics.mean(gaps) * 100:>7.2f}% {max(gaps) * 100:>6.2f}% "
              f"{sum(g > 0.01 for g in gaps):>4}"
              + (f"  ({r['ok_mismatch']} ok/unschedulable mismatches!)" if r["ok_mismatch"] else ""), flush=True)
    print("\nbare: a linear scan over the pool's GPU records for the cheapest GPU with the memory free (issue 12's "
          "baseline);\ntuples: the same scan over (free GB, price, index) tuples built beforehand, not timed (an extra line)")
    print("rates are decisions per CPU-second; p50/p99 in CPU ms per decision; ÷exh compares the same requests; "
          "gaps are the\nexhaustive score minus the fast choice's score under it, as a share of the exhaustive score")
    print("unplaced or preempting decisions (they also count every GPU's refusal reason or plan preemption): "
          + ", ".join(f"{r['gpus']} GPUs {r['other_share'] * 100:.0f}% (p50 {r['other_p50'] * 1e3:.2f} ms)"
                      for r in rows))
    by = {r["gpus"]: r for r in rows}
    r10 = by.get(min(by, key=lambda n: abs(n - 10_000)))
    big = by[max(by)]
    all_gaps = [g for r in rows for g in r["gaps"]]
    over = sum(g > 0.01 for g in all_gaps)
    print(f"\nagainst the targets (issue 12), calibration {calib / 1e6:.2f} M/s:")
    print(f"  ours ÷ bare scan at {r10['gpus']} GPUs: {r10['ours'] / r10['bare']:.2f}x "
          f"(target >= 3x; ÷ the tuple scan {r10['ours'] / r10['tuples']:.2f}x); at {big['gpus']}: "
          f"{big['ours'] / big['bare']:.1f}x")
    print(f"  one decision at {r10['gpus']} GPUs costs the CPU of {calib / r10['ours']:,.0f} calibration-loop "
          f"iterations (the bare scan's: {calib / r10['bare']:,.0f})")
    if big is not r10:
        print(f"  p99 growth {r10['gpus']} -> {big['gpus']} GPUs: {big['p99'] / r10['p99']:.2f}x in CPU time "
              f"(target < 2x)")
    print(f"  ours ÷ exhaustive at {r10['gpus']} GPUs: {r10['exh_x']:.1f}x in CPU time (target >= 20x); "
          f"{over} of {len(all_gaps)} compared decisions over 1% below the exhaustive score, worst "
          f"{max(all_gaps or [0.0]) * 100:.2f}% (target: none)")


if __name__ == "__main__":
    main()
