"""Metrics ingest benchmark: many simulated agents (8 GPUs each, 1 s interval) against a running server.

Prints the sustained GPU samples per second ingested (counted in the rollups the gateway wrote), the
p50/p99 latency from an agent's send to a subscribed console socket, and beside them, in the same run, a
raw channel-layer echo on the same server stack (bench/echo_asgi.py): its round-trip latency at the same
load, and both ceilings when the agents send as fast as the server takes frames.

    .venv/bin/python bench/metrics_ingest.py            # 500 nodes × 8 GPUs, 1 Hz, 20 s windows
    .venv/bin/python bench/metrics_ingest.py --quick    # 100 nodes, 8 s windows
Uses REDIS_URL (Redis channel layer) when set, else the in-memory layer of the embedded default.
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.livestack import LiveStack, free_port, wait_until  # noqa: E402


def rollup_samples(db: Path) -> int:
    with sqlite3.connect(db, timeout=30) as con:
        return con.execute("select coalesce(sum(samples), 0) from scheduler_gpumetricrollup").fetchone()[0]


def echo_samples(port: int) -> int:
    """Frames the echo server has passed through its layer, × 8 GPU samples each."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=30) as resp:
        return json.loads(resp.read())["frames"] * 8


def run_load(stack: LiveStack, port: int, seed_file: Path, mode: str, args, interval: float) -> dict:
    # At saturation nobody watches: the ceiling is what the server ingests, not what a browser could read.
    subscribers = args.subscribers if interval else 0
    cmd = [sys.executable, str(ROOT / "bench" / "_load.py"), "--mode", mode, "--port", str(port), "--seed",
           str(seed_file), "--nodes", str(args.nodes), "--interval", str(interval), "--seconds", str(args.seconds),
           "--warmup", str(args.warmup), "--subscribers", str(subscribers)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    clock = json.loads(proc.stdout.readline())
    db = stack.tmp / "db.sqlite3"

    def count() -> int:  # what the server took in: rollup samples written, or frames through the echo
        return echo_samples(port) if mode == "echo" else rollup_samples(db)
    time.sleep(max(0.0, clock["warm"] - time.time()))
    a, ta = count(), time.time()
    time.sleep(max(0.0, clock["stop"] - time.time()))
    b, tb = count(), time.time()
    line = proc.stdout.readline()
    proc.wait(timeout=60)
    if not line:
        raise SystemExit(f"the {mode} load process failed (exit {proc.returncode}); server log:\n"
                         + stack.logs()[-3000:])
    out = json.loads(line)
    if out["closed"]:
        print(f"  note: the server closed {out['closed']} {mode} sockets during the run: {out['close_reasons']}")
    out["ingested_per_s"] = (b - a) / (tb - ta)
    out["offered_per_s"] = args.nodes * 8 / interval if interval else None
    return out


def ms(x):
    return f"{x * 1000:7.1f} ms" if x is not None else "      —"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--subscribers", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="100 nodes, 8 s windows")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.seconds, args.warmup = 100, 8, 3
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        stack = LiveStack(tmp, nodes=[(f"bench-{i:04d}", "h100-80gb:8") for i in range(args.nodes)],
                          celery=False, start_agents=False,
                          # Keepalive pings answered late by an overloaded load process would close sockets
                          # mid-measurement; liveness is not what this bench measures.
                          web_args=("--ws-ping-interval", "86400"),
                          # The saturation phase sends as fast as the server takes frames: lift the
                          # per-socket rate limit there, the bench measures ingest, not the limiter.
                          env={"FLEET_METRICS_FLUSH": "0.5", "FLEET_AGENT_METRICS_RATE": "1000000",
                               "FLEET_AGENT_METRICS_BURST": "1000000"})
        try:
            stack.start()
            seed_file = tmp / "seed.json"
            seed_file.write_text(json.dumps(stack.seed))
            echo_port = free_port()
            stack._spawn("echo", ["-m", "uvicorn", "bench.echo_asgi:application", "--host", "127.0.0.1", "--port",
                                  str(echo_port), "--ws", "websockets-sansio", "--log-level", "warning",
                                  "--ws-ping-interval", "86400"])
            wait_until(lambda: stack._port_open_at(echo_port), timeout=60, what="the echo server")
            print(f"{args.nodes} agents × 8 GPUs; windows of {args.seconds:g} s after {args.warmup:g} s warm-up; "
                  f"channel layer: {'Redis' if 'REDIS_URL' in stack.env else 'in-memory'}")
            rated = run_load(stack, stack.port, seed_file, "gateway", args, 1.0)
            echo_rated = run_load(stack, echo_port, seed_file, "echo", args, 1.0)
            sat = run_load(stack, stack.port, seed_file, "gateway", args, 0.0)
            echo_sat = run_load(stack, echo_port, seed_file, "echo", args, 0.0)
        finally:
            stack.stop()
    print(f"\n{'':34}{'samples/s':>12}{'p50':>12}{'p99':>12}")
    print(f"{'gateway at 1 Hz (offered ' + str(int(rated['offered_per_s'])) + '/s)':34}"
          f"{rated['ingested_per_s']:12.0f}{ms(rated['p50']):>12}{ms(rated['p99']):>12}")
    print(f"{'raw echo at 1 Hz':34}{echo_rated['ingested_per_s']:12.0f}{ms(echo_rated['p50']):>12}{ms(echo_rated['p99']):>12}")
    print(f"{'gateway, as fast as it takes':34}{sat['ingested_per_s']:12.0f}{ms(sat['p50']):>12}{ms(sat['p99']):>12}")
    print(f"{'raw echo, as fast as it takes':34}{echo_sat['ingested_per_s']:12.0f}{ms(echo_sat['p50']):>12}{ms(echo_sat['p99']):>12}")
    ratio = sat["ingested_per_s"] / echo_sat["ingested_per_s"] if echo_sat["ingested_per_s"] else float("nan")
    print(f"\ningest ceiling / raw echo ceiling = {ratio:.2f}  (target ≥ 0.50)")
    print(f"sustained at 1 Hz = {rated['ingested_per_s']:.0f} samples/s (target ≥ 4,000 at 500 nodes), "
          f"p99 {ms(rated['p99']).strip()} (target < 1 s)")


if __name__ == "__main__":
    main()
