"""Metrics ingest benchmark: many simulated agents (8 GPUs each) against running web processes.

First the ceilings: agents send as fast as the server takes frames, and the bench counts the GPU samples
the gateway ingested and wrote (the growth of the GPU-minute rollups in the database); beside it, on the
same server stack, a raw channel-layer echo (bench/echo_asgi.py) driven the same way. Then the latency at
an offered load of at most a quarter of that gateway ceiling (1 Hz per agent, or slower if 1 Hz would be
more): p50/p99 from an agent's send to a subscribed console socket, the echo's round trip beside it, and
the check "p99 < 1 s at <= 25% of the ceiling" printed as a ratio with PASS or FAIL.

    .venv/bin/python bench/metrics_ingest.py            # embedded default: 1 web process, SQLite, in-memory layer
    .venv/bin/python bench/metrics_ingest.py --quick    # 100 agents, 8 s windows
    REDIS_URL=redis://127.0.0.1:6379/13 DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench \\
        .venv/bin/python bench/metrics_ingest.py --redis    # 2 web processes on PostgreSQL + Redis
With --redis, agents alternate between the two web processes and each console socket watches agents of
both; the bench creates its own database `<DATABASE_URL's name>_bench_<pid>` on that server and drops it
at the end (the named database is not touched).
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.livestack import LiveStack, free_port, wait_until  # noqa: E402

QUARTER = 0.25  # the offered load the latency is held to, as a share of the ceiling measured in the run
P99_LIMIT = 1.0  # seconds


@contextmanager
def bench_database(url: str):
    """A fresh PostgreSQL database beside the one DATABASE_URL names; yields its URL, drops it after."""
    import psycopg

    parsed = urlparse(url)
    name = f"{parsed.path.lstrip('/')}_bench_{os.getpid()}"
    admin = dict(host=parsed.hostname or "127.0.0.1", port=parsed.port or 5432, user=parsed.username or "postgres",
                 password=parsed.password or "", dbname="postgres", autocommit=True)
    with psycopg.connect(**admin) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    try:
        yield parsed._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(**admin) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rollup_counter(stack: LiveStack):
    """What the gateway wrote: the samples in the GPU-minute rollups, read from the stack's database."""
    query = "select coalesce(sum(samples), 0) from scheduler_gpumetricrollup"
    url = stack.env.get("DATABASE_URL")
    if url:
        import psycopg

        def count() -> int:
            with psycopg.connect(url) as con:
                return int(con.execute(query).fetchone()[0])
        return count

    def count_sqlite() -> int:
        with sqlite3.connect(stack.tmp / "db.sqlite3", timeout=30) as con:
            return con.execute(query).fetchone()[0]
    return count_sqlite


def echo_samples(port: int) -> int:
    """Frames the echo server has passed through its layer, × 8 GPU samples each."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=30) as resp:
        return json.loads(resp.read())["frames"] * 8


def run_load(stack: LiveStack, ports: list[int], seed_file: Path, mode: str, args, interval: float, count) -> dict:
    # At saturation nobody watches: the ceiling is what the server ingests, not what a browser could read.
    subscribers = args.subscribers if interval else 0
    cmd = [sys.executable, str(ROOT / "bench" / "_load.py"), "--mode", mode, "--port", ",".join(map(str, ports)),
           "--seed", str(seed_file), "--nodes", str(args.nodes), "--interval", str(interval), "--seconds",
           str(args.seconds), "--warmup", str(args.warmup), "--subscribers", str(subscribers)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    clock = json.loads(proc.stdout.readline())
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


def start(tmp: Path, args, env: dict) -> tuple[LiveStack, list[int], int]:
    stack = LiveStack(tmp, nodes=[(f"bench-{i:04d}", "h100-80gb:8") for i in range(args.nodes)],
                      celery=False, start_agents=False,
                      # Keepalive pings answered late by an overloaded load process would close sockets
                      # mid-measurement; liveness is not what this bench measures.
                      web_args=("--ws-ping-interval", "86400"),
                      # The saturation phase sends as fast as the server takes frames: lift the per-socket
                      # rate limit there, the bench measures ingest, not the limiter.
                      env={"FLEET_METRICS_FLUSH": "0.5", "FLEET_AGENT_METRICS_RATE": "1000000",
                           "FLEET_AGENT_METRICS_BURST": "1000000", **env})
    stack.start()
    ports = [stack.port]
    if args.redis:  # the second web process of the production layout, on the same database and layer
        ports.append(free_port())
        stack._spawn("web2", ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                              str(ports[1]), "--ws", "config.wsprotocol:WebSocketProtocol", "--log-level", "warning",
                              "--ws-ping-interval", "86400"])
        wait_until(lambda: stack._port_open_at(ports[1]), timeout=60, what="the second web process")
    echo_port = free_port()
    stack._spawn("echo", ["-m", "uvicorn", "bench.echo_asgi:application", "--host", "127.0.0.1", "--port",
                          str(echo_port), "--ws", "config.wsprotocol:WebSocketProtocol", "--log-level", "warning",
                          "--ws-ping-interval", "86400"])
    wait_until(lambda: stack._port_open_at(echo_port), timeout=60, what="the echo server")
    return stack, ports, echo_port


def measure(tmp: Path, args, env: dict) -> dict:
    stack, ports, echo_port = start(tmp, args, env)
    try:
        seed_file = tmp / "seed.json"
        seed_file.write_text(json.dumps(stack.seed))
        count, echo_count = rollup_counter(stack), (lambda: echo_samples(echo_port))
        layout = (f"{len(ports)} web processes, PostgreSQL, Redis layer" if args.redis
                  else "1 web process, SQLite, in-memory layer (embedded default)")
        print(f"{args.nodes} agents × 8 GPUs; windows of {args.seconds:g} s after {args.warmup:g} s warm-up; {layout}",
              flush=True)
        sat = run_load(stack, ports, seed_file, "gateway", args, 0.0, count)
        echo_sat = run_load(stack, [echo_port], seed_file, "echo", args, 0.0, echo_count)
        ceiling = sat["ingested_per_s"]
        # 1 Hz per agent (the product's interval), slowed down only if that would be over a quarter of the ceiling.
        interval = max(1.0, args.nodes * 8 / (QUARTER * ceiling)) if ceiling else 1.0
        rated = run_load(stack, ports, seed_file, "gateway", args, interval, count)
        echo_rated = run_load(stack, [echo_port], seed_file, "echo", args, interval, echo_count)
    finally:
        stack.stop()
    return {"sat": sat, "echo_sat": echo_sat, "rated": rated, "echo_rated": echo_rated, "interval": interval}


def report(r: dict, *, redis: bool) -> bool:
    sat, echo_sat, rated, echo_rated = r["sat"], r["echo_sat"], r["rated"], r["echo_rated"]
    hz = f"{1 / r['interval']:.2g} Hz"
    print(f"\n{'':40}{'samples/s':>12}{'p50':>12}{'p99':>12}")
    print(f"{'gateway, as fast as it takes (ceiling)':40}{sat['ingested_per_s']:12.0f}")
    print(f"{'raw echo, as fast as it takes':40}{echo_sat['ingested_per_s']:12.0f}")
    offered = f"gateway at {hz} (offered {rated['offered_per_s']:,.0f}/s)"
    print(f"{offered:40}{rated['ingested_per_s']:12.0f}{ms(rated['p50']):>12}{ms(rated['p99']):>12}")
    echo_label = f"raw echo at {hz}"
    print(f"{echo_label:40}{echo_rated['ingested_per_s']:12.0f}"
          f"{ms(echo_rated['p50']):>12}{ms(echo_rated['p99']):>12}")
    if redis:
        print("\n(the raw echo through Redis fills its one channel and drops frames at saturation: no ceiling ratio)")
    else:
        print(f"\ningest ceiling / raw echo ceiling = {sat['ingested_per_s'] / echo_sat['ingested_per_s']:.2f}")
    share = rated["offered_per_s"] / sat["ingested_per_s"] if sat["ingested_per_s"] else float("inf")
    p99 = rated["p99"] if rated["p99"] is not None else float("inf")
    ok = share <= QUARTER and p99 < P99_LIMIT and rated["n_latency"] > 0
    print(f"check p99 < {P99_LIMIT:g} s at ≤ {QUARTER:.0%} of the ceiling: offered / ceiling = {share:.2f}, "
          f"p99 / {P99_LIMIT:g} s = {p99 / P99_LIMIT:.2f} ({rated['n_latency']} latencies) → "
          f"{'PASS' if ok else 'FAIL'}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--subscribers", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="100 nodes, 8 s windows")
    ap.add_argument("--redis", action="store_true",
                    help="2 web processes on PostgreSQL + Redis (needs REDIS_URL and DATABASE_URL)")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.seconds, args.warmup = 100, 8, 3
    with tempfile.TemporaryDirectory() as tmp:
        if args.redis:
            if not (os.environ.get("REDIS_URL") and os.environ.get("DATABASE_URL", "").startswith("postgres")):
                raise SystemExit("--redis needs REDIS_URL and a PostgreSQL DATABASE_URL")
            with bench_database(os.environ["DATABASE_URL"]) as url:
                result = measure(Path(tmp), args, {"DATABASE_URL": url})
        else:  # the embedded default, whatever this shell has set
            result = measure(Path(tmp), args, {"REDIS_URL": ""})
    sys.exit(0 if report(result, redis=args.redis) else 1)


if __name__ == "__main__":
    main()
