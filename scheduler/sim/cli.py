"""`python -m scheduler.sim`: replay an openb trace against each placement policy and compare them."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from scheduler.errors import DomainError

from . import inflation
from .mapping import FRACTION_BASES, parse_model_map
from .policies import POLICY_NAMES, factories
from .report import plot, reasons_text, table, write_json
from .run import (DEFAULT_TRACE, DEFAULT_TRACE_DIR, HOST_CHOICES, SimConfig, payload, policy_list, prepare, run_all,
                  trace_path)
from .variants import NodeVariant, PodVariant

PROG = "python -m scheduler.sim"


def _variant(cls):
    def parse(value: str):
        try:
            return cls.parse(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = cls.__name__  # argparse names the type in its error message
    return parse


def _protect(value: str) -> float | None:
    return None if value.lower() in ("off", "none", "-1") else float(value)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--trace", type=trace_path, default=DEFAULT_TRACE_DIR / DEFAULT_TRACE,
                    help="pod list CSV (a bare openb file name is looked up in the default trace folder)")
    ap.add_argument("--nodes", type=Path, default=None, help="node list CSV (default: the one beside --trace)")
    ap.add_argument("--pool", choices=("openb", "modern"), default="openb",
                    help="openb: the trace's node list through --model-map; modern: DESIGN §9's pool")
    ap.add_argument("--pool-scale", type=float, default=0.02,
                    help="keep this share of each model's nodes (0.02 = 133 of openb's 6,212 GPUs: the trace "
                         "at full size asks for ~1%% of its cluster, see docs/simulator.md)")
    ap.add_argument("--model-map", default=None,
                    help="override trace model -> catalog key: JSON file, JSON object or 'T4=a100-40gb,G2=h100-80gb'")
    ap.add_argument("--variant", type=_variant(PodVariant), default=None,
                    help="redraw the pods' shapes: 'share=0.6,spec=0.2,multi=0.3,seed=7' (fractions of the GPU "
                         "pods that share a GPU, are pinned to a model, ask for several GPUs; see docs)")
    ap.add_argument("--nodes-variant", type=_variant(NodeVariant), default=None,
                    help="a generated pool instead of --pool: 'gpus=400,big=0.6,h100=0.35,l4=0.3,seed=3' (8-GPU "
                         "A100/H100 nodes beside single-GPU A10/L4 servers)")
    ap.add_argument("--load", type=float, default=1.0, help="arrival-rate multiplier (arrival times / LOAD)")
    ap.add_argument("--limit", type=int, default=None, metavar="N",
                    help="replay the trace's rows up to its N-th row that asks for a GPU (CPU-only rows before "
                         "it are counted, not replayed as GPU jobs)")
    ap.add_argument("--donor", type=Path, default=None, metavar="PATH",
                    help="pod list a file without time columns borrows arrivals and runtimes from; none given: "
                         "openb_pod_list_default.csv beside --trace")
    ap.add_argument("--host", choices=HOST_CHOICES, default="ignore",
                    help="model: book each pod's host CPU and memory on its node and replay CPU-only pods "
                         "(openb node lists give them); ignore: GPUs only")
    ap.add_argument("--missing-runtime", choices=("skip", "synthesize"), default="skip",
                    help="rows of a timed trace without a usable runtime (counted either way)")
    ap.add_argument("--seed", type=int, default=0, help="seed for synthesized times and random-fit")
    ap.add_argument("--node-order", type=int, default=None, metavar="SEED",
                    help="shuffle the pool's node order with SEED (the same nodes): policies that break ties by "
                         "pool order then break them differently")
    ap.add_argument("--fraction-basis", choices=FRACTION_BASES, default="memory",
                    help="turn gpu_milli into a MIG profile by memory or by compute share")
    ap.add_argument("--reference-gb", type=float, default=80.0,
                    help="memory of the GPU a gpu_milli share is a share of (basis memory)")
    ap.add_argument("--head-protect", type=_protect, default=3600.0,
                    help="seconds the queue head may wait before backfill stops passing it ('off' = never)")
    ap.add_argument("--window", choices=("arrivals", "drain"), default="arrivals",
                    help="average metrics until the last arrival or until the last completion")
    ap.add_argument("--warmup", type=float, default=0.01,
                    help="metrics are averaged from the arrival of this quantile of the jobs (see docs)")
    ap.add_argument("--policies", default=",".join(POLICY_NAMES),
                    help=f"comma-separated, from: {', '.join(POLICY_NAMES)}")
    ap.add_argument("--json", type=Path, default=None, help="write the full results as JSON here")
    ap.add_argument("--plot", type=Path, default=None, help="write allocation and queue length over time (PNG)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    # --- issue 12 §1: the FGD paper's protocol (its own options: --protocol inflation --help) ---
    ap.add_argument("--protocol", choices=PROTOCOLS, default="replay",
                    help="replay: the trace's own times and runtimes (this page); inflation: the FGD paper's "
                         "workload inflation on the whole openb cluster with fractional sharing (docs/simulator.md)")
    return ap


PROTOCOLS = ("replay", "inflation")


def _protocol(argv: list[str]) -> tuple[str, list[str]]:
    """The --protocol value and the other arguments (each protocol has its own options)."""
    for i, a in enumerate(argv):
        if a == "--protocol" and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if a.startswith("--protocol="):
            return a.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return "replay", argv


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    protocol, rest = _protocol(argv)
    if protocol == "inflation":
        return inflation.main(rest)
    args = parser().parse_args(argv)
    try:
        return _run(args)
    except DomainError as e:
        # Input the replay cannot use (a missing companion file, an unmapped model name): one line, status 2.
        print(f"{PROG}: error: {e.message}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    names, problem = policy_list(args.policies, POLICY_NAMES)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    config = SimConfig(trace=args.trace, nodes=args.nodes, pool=args.pool, pool_scale=args.pool_scale,
                       model_map=parse_model_map(args.model_map), load=args.load, limit=args.limit,
                       missing_runtime=args.missing_runtime, seed=args.seed, basis=args.fraction_basis,
                       reference_gb=args.reference_gb, head_protect_s=args.head_protect, window=args.window,
                       warmup=args.warmup, host=args.host, donor=args.donor, variant=args.variant,
                       nodes_variant=args.nodes_variant, node_order=args.node_order)
    progress = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    prepared = prepare(config)
    results = run_all(prepared, factories(names, seed=args.seed), progress)
    data = payload(prepared, results)
    print(describe(data))
    print()
    print(table(data["policies"]))
    print(f"bound: no policy can average more than {data['allocation_bound']:.1%} allocation on these arrivals "
          f"(fluid relaxation, scheduler/sim/bound.py)")
    reasons = reasons_text(data["policies"])
    if reasons:
        print(reasons)
    print(f"\n{len(results)} policies in {time.perf_counter() - t0:.1f}s wall clock")
    if args.json:
        write_json(args.json, data)
    if args.plot:
        pool = data["pool"]
        plot(args.plot, results, f"{Path(config.trace).name} on {pool['gpus']} GPUs ({config.pool}, "
                                 f"scale {config.pool_scale:g}), load x{config.load:g}")
    return 0


def describe(data: dict) -> str:
    """The header of a report: what was replayed on what, and every row that was not replayed as is."""
    tr, pool, cfg = data["trace"], data["pool"], data["config"]
    cpu_only = tr.get("cpu_only_pods", 0)
    lines = [f"trace {Path(tr['path']).name}: {tr['rows']} rows -> {tr['pods'] - cpu_only} GPU jobs"
             + (f" and {cpu_only} CPU-only jobs (host CPU and memory modelled)" if cpu_only else "")]
    for why, n in tr["skipped"].items():
        lines.append(f"  skipped {n}: {why}")
    for why, n in tr["synthesized"].items():
        lines.append(f"  synthesized {n}: {why}")
    lines += [f"  note: {n}" for n in tr["notes"]]
    where = f"variant {cfg['nodes_variant']}" if cfg.get("nodes_variant") else f"{cfg['pool']} x{cfg['pool_scale']:g}"
    lines.append(f"pool {where}: {pool['nodes']} nodes, {pool['gpus']} GPUs ("
                 + ", ".join(f"{k} {v['gpus']}" for k, v in pool["by_model"].items()) + ")")
    lines += [f"  note: {n}" for n in data.get("notes", ())]
    start, end = data["window_s"]
    window = f"{start:,.0f}..{end:,.0f} s" if end is not None else f"{start:,.0f} s until drained"
    protect = "off" if cfg["head_protect_s"] is None else f"{cfg['head_protect_s']:g} s"
    lines.append(f"load x{cfg['load']:g}, fraction basis {cfg['fraction_basis']} (reference "
                 f"{cfg['reference_gb']:g} GB), head protection {protect}, metric window {window}")
    return "\n".join(lines)
