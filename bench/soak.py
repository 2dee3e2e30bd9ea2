"""Soak: the demo topology under a steady mixed load for a bounded time, watching for leaks and lost work.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/soak.py [--minutes 30]
    .venv/bin/python bench/soak.py --embedded [--minutes 30]

Starts the production layout on loopback (tests/e2e/cluster.py: 2 uvicorn, 2 Celery workers, beat, its own
PostgreSQL database on $DATABASE_URL's server and its own redis-server), or with --embedded the embedded default
(tests/e2e/livestack.py: one uvicorn, one worker, beat, SQLite, no Redis), with --agents simulated agents (real
`python -m nodeagent --simulate` processes, simulated container runtime). Buyers place a steady stream of orders
in every mode — on demand (a job that exits, an interactive container), spot bids, reserved windows, and a
reserved window's later half resold to another buyer — while their consoles watch their market events and a
provider's consoles watch every node's metrics. A process that exits is counted and started again.

Prints: orders placed (and refused, and 5xx) per mode, p50/p99 order→running (on demand and spot: the order's
answer to the lease_running event on the buyer's console), GPU readings ingested (the rollups' samples) and
metrics frames the consoles got, restarts per process (should be 0), the RSS of each process after warm-up and
at the end (flat: growth < 10%), and ledger_check() at the end. The last line is the same as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from tests.e2e.cluster import Cluster, engines_missing  # noqa: E402
from tests.e2e.livestack import LiveStack, wait_until  # noqa: E402

NODE_SHAPES = ("h100-80gb:2", "a100-80gb:2", "l4:2")  # MIG slices on the first two, whole GPUs on the L4s
BUYERS = 4
# Beat periods of a busy deployment, a little faster than the defaults so a short run sees every path.
BEAT = {"MARKET_METER_SECONDS": "1", "MARKET_LEASE_TICK_SECONDS": "1", "MARKET_QUEUE_SECONDS": "2",
        "MARKET_SPOT_PRICE_SECONDS": "10", "MARKET_SPOT_NOTICE_SECONDS": "5", "MARKET_PREEMPT_NOTICE_SECONDS": "5",
        "FLEET_HEARTBEAT_TIMEOUT": "15", "FLEET_OFFLINE_CHECK": "2", "FLEET_METRICS_FLUSH": "1",
        "API_THROTTLE_USER": "100000/min"}
SAMPLE_SECONDS = 5.0

BOOKS = r"""
import json
from django.db.models import Sum
from marketplace.money.check import ledger_check
from scheduler.models import GpuMetricRollup
print("BOOKS" + json.dumps({"problems": ledger_check(),
                            "samples": GpuMetricRollup.objects.aggregate(n=Sum("samples"))["n"] or 0}))
"""


def iso(at: datetime) -> str:
    return at.isoformat()


def rss_of_group(pgid: int) -> int:
    """Resident memory (bytes) of every process in process group `pgid` (a prefork worker and its children)."""
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[2]) != pgid:
                continue
            total += int(Path(entry.path, "statm").read_text().split()[1]) * page
        except (OSError, ValueError):
            continue  # gone meanwhile
    return total


class Console(threading.Thread):
    """A signed-in console socket: counts metrics frames, notes when each lease_running event arrives."""

    def __init__(self, stack: LiveStack, session: str, web: int, subscriptions: list[dict], stop: threading.Event):
        super().__init__(daemon=True)
        self.stack, self.session, self.web, self.subscriptions, self.stop = stack, session, web, subscriptions, stop
        self.frames = 0
        self.reconnects = 0
        self.errors: Counter = Counter()
        self.running_at: dict[str, float] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with connect(self.stack.console_url(self.web), open_timeout=10,
                             additional_headers=self.stack.console_headers(self.session, self.web)) as ws:
                    for target in self.subscriptions:
                        ws.send(json.dumps({"subscribe": target}))
                    while not self.stop.is_set():
                        try:
                            message = json.loads(ws.recv(timeout=1))
                        except TimeoutError:
                            continue
                        if message["type"] == "metrics":
                            self.frames += 1
                        elif message["type"] == "market" and message["event"].get("type") == "lease_running":
                            self.running_at.setdefault(message["event"]["lease"], time.time())
            except (OSError, ConnectionClosed, TimeoutError) as exc:
                if self.stop.is_set():
                    break
                self.reconnects += 1
                self.errors[f"{type(exc).__name__}: {exc}"[:120]] += 1
                self.stop.wait(1)


class Orders:
    """The buyers' steady stream: one order every `every` seconds, the modes in turn."""

    MODES = ("on_demand_job", "on_demand_interactive", "spot", "reserved", "resale")

    def __init__(self, stack: LiveStack, buyers: list[dict], webs: int):
        self.stack, self.buyers, self.webs = stack, buyers, webs
        self.placed: dict[str, int] = {m: 0 for m in self.MODES}
        self.refused: dict[str, int] = {m: 0 for m in self.MODES}
        self.reasons: dict[str, Counter] = {m: Counter() for m in self.MODES}  # the refusals' messages
        self.server_errors: list[tuple[str, int, dict]] = []
        self.lease_placed_at: dict[str, float] = {}  # on demand and spot: lease -> when its order was answered
        self.rng = random.Random(7)
        self.lock = threading.Lock()

    def _call(self, mode: str, i: int, method: str, path: str, body: dict | None, buyer: dict) -> tuple[int, dict]:
        status, answer = self.stack.api(method, path, body, key=buyer["api_key"], web=i % self.webs)
        with self.lock:
            if status >= 500:
                self.server_errors.append((mode, status, answer))
            elif status not in (200, 201, 202):
                self.refused[mode] += 1
                self.reasons[mode][f"{status} {answer.get('error', {}).get('message', answer)}"[:160]] += 1
        return status, answer

    def place(self, i: int) -> None:
        mode = self.MODES[i % len(self.MODES)]
        buyer = self.buyers[i % len(self.buyers)]
        now = datetime.now(timezone.utc)
        if mode == "on_demand_job":
            body = {"mode": "on_demand", "gpu_models": ["h100-80gb", "a100-80gb"], "memory_gb": 10,
                    "duration_seconds": 300, "workload": {"image": "docker.io/library/python:3.12", "kind": "job",
                                                          "env": [{"name": "SIM_RUN_SECONDS",
                                                                   "value": str(self.rng.randint(5, 40))}]}}
            status, answer = self._call(mode, i, "POST", "/api/v1/orders/", body, buyer)
            leases = answer.get("leases", []) if status == 201 else []
        elif mode == "on_demand_interactive":
            body = {"mode": "on_demand", "gpu_models": ["l4"], "whole_gpu": True,
                    "duration_seconds": self.rng.randint(20, 90),
                    "workload": {"image": "docker.io/library/ubuntu:24.04", "kind": "interactive"}}
            status, answer = self._call(mode, i, "POST", "/api/v1/orders/", body, buyer)
            leases = answer.get("leases", []) if status == 201 else []
        elif mode == "spot":
            body = {"gpu_models": ["h100-80gb", "a100-80gb"], "memory_gb": 20, "max_price_per_hour": "0.5",
                    "duration_seconds": self.rng.randint(20, 90)}
            status, answer = self._call(mode, i, "POST", "/api/v1/bids/", body, buyer)
            leases = answer.get("order", {}).get("leases", []) if status == 201 else []
        elif mode == "reserved":
            start = now + timedelta(seconds=15)
            body = {"mode": "reserved", "gpu_models": ["l4"], "window_start": iso(start),
                    "window_end": iso(start + timedelta(seconds=self.rng.randint(20, 60)))}
            status, answer = self._call(mode, i, "POST", "/api/v1/orders/", body, buyer)
            leases = []
        else:  # a reserved window whose later half its holder resells to the next buyer
            start, seconds = now + timedelta(seconds=90), 120
            body = {"mode": "reserved", "gpu_models": ["l4"], "window_start": iso(start),
                    "window_end": iso(start + timedelta(seconds=seconds))}
            status, answer = self._call(mode, i, "POST", "/api/v1/orders/", body, buyer)
            leases = []
            if status == 201:
                half = start + timedelta(seconds=seconds // 2)
                status, listing = self._call(mode, i, "POST",
                                             f"/api/v1/reservations/{answer['reservations'][0]}/list-for-resale/",
                                             {"starts_at": iso(half), "ends_at": iso(start + timedelta(seconds=seconds)),
                                              "ask_per_hour": "0.01"}, buyer)
                if status == 201:
                    other = self.buyers[(i + 1) % len(self.buyers)]
                    status, _ = self._call(mode, i, "POST", f"/api/v1/resale-listings/{listing['id']}/buy/", None,
                                           other)
        answered = time.time()
        with self.lock:
            if status in (201, 202):
                self.placed[mode] += 1
            for lease in leases:
                self.lease_placed_at[lease] = answered


class Watch:
    """Supervises the stack's processes (an exit is counted, then the process is started again) and samples the
    resident memory of each."""

    def __init__(self, stack: LiveStack, stop: threading.Event):
        self.stack, self.stop = stack, stop
        self.restarts: dict[str, int] = {name: 0 for name in stack.procs}
        self.rss: dict[str, list[tuple[float, int]]] = {name: [] for name in stack.procs}

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_SECONDS):
            now = time.time()
            for name, proc in list(self.stack.procs.items()):
                if proc.poll() is not None and name != "redis":
                    self.restarts[name] += 1
                    print(f"  {name} exited with {proc.returncode}: started again", flush=True)
                    self.stack.restart(name)
                    continue
                self.rss[name].append((now, rss_of_group(proc.pid)))

    def growth(self, warm_until: float, window: float) -> dict[str, tuple[int, int, float]]:
        """name -> (mean RSS in the first `window` s after warm-up, in the last `window` s, growth ratio)."""
        out = {}
        for name, samples in self.rss.items():
            if not samples:
                continue
            end = samples[-1][0]
            first = [r for t, r in samples if warm_until <= t < warm_until + window]
            last = [r for t, r in samples if t > end - window]
            if first and last:
                base, tail = statistics.mean(first), statistics.mean(last)
                out[name] = (int(base), int(tail), tail / base - 1)
        return out


def pct(values: list[float], p: float) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] if values else None


def build(args, tmp: Path) -> LiveStack:
    nodes = [(f"soak-{i:02d}", NODE_SHAPES[i % len(NODE_SHAPES)]) for i in range(args.agents)]
    if args.embedded:
        return LiveStack(tmp, nodes=nodes, env={**BEAT, "REDIS_URL": ""}, agent_interval=1.0)
    missing = engines_missing()
    if missing:
        sys.exit(f"{missing}; or run the embedded default with --embedded")
    return Cluster(tmp, nodes=nodes, webs=2, workers=2, concurrency=2, env=BEAT, fast=False, agent_interval=1.0)


def soak(args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="gpm-soak-"))
    stack = build(args, tmp)
    stop = threading.Event()
    started = time.time()
    try:
        stack.start()
        webs = len(stack.web_urls)
        buyers = stack.add_buyers([f"soak-buyer-{i}" for i in range(BUYERS)], credit="1000000")
        node_ids = [n["id"] for n in stack.seed["nodes"]]
        wait_until(lambda: sum(n["status"] == "online" for n in stack.api(
            "GET", f"/api/v1/nodes/?limit={len(node_ids)}")[1].get("results", [])) == len(node_ids),
            timeout=180, interval=1, what=f"{len(node_ids)} agents online")
        print(f"{type(stack).__name__} up in {time.time() - started:.0f} s: {webs} web, {len(node_ids)} agents; "
              f"soaking {args.minutes:g} min (warm-up {args.warmup:g} min)", flush=True)
        consoles = [Console(stack, b["session"], i % webs, [], stop) for i, b in enumerate(buyers)]
        consoles += [Console(stack, stack.seed["session"], i % webs, [{"node": n} for n in node_ids[i::2]], stop)
                     for i in range(2)]  # the provider's: every node's metrics, split over two sockets
        watch = Watch(stack, stop)
        for thread in (*consoles, threading.Thread(target=watch.run, daemon=True)):
            thread.start()
        orders = Orders(stack, buyers, webs)
        begin = time.time()
        warm_until, end = begin + args.warmup * 60, begin + args.minutes * 60
        with ThreadPoolExecutor(8) as pool:
            i = 0
            while time.time() < end:
                pool.submit(orders.place, i)
                i += 1
                time.sleep(max(0.0, begin + i * args.order_every - time.time()))
        time.sleep(5)  # the last orders' leases start
        stop.set()
        books = stack.shell(BOOKS, "BOOKS")
    except BaseException:
        print(stack.logs()[-6000:], file=sys.stderr)
        raise
    finally:
        stop.set()
        stack.stop()

    running_at = {}
    for console in consoles[:BUYERS]:
        running_at.update(console.running_at)
    latencies = [running_at[lease] - at for lease, at in orders.lease_placed_at.items() if lease in running_at]
    growth = watch.growth(warm_until, window=min(60.0, (end - warm_until) / 3))
    core = {name: g for name, g in growth.items() if not name.startswith("agent-")}
    agents = [g for name, g in growth.items() if name.startswith("agent-")]
    return {
        "topology": "embedded" if args.embedded else "cluster", "minutes": args.minutes, "agents": args.agents,
        "orders_placed": orders.placed, "orders_refused": orders.refused, "server_errors": len(orders.server_errors),
        "server_error_samples": orders.server_errors[:3],
        "refusal_reasons": {m: dict(c.most_common(3)) for m, c in orders.reasons.items() if c},
        "order_to_running_p50_s": pct(latencies, 0.5), "order_to_running_p99_s": pct(latencies, 0.99),
        "leases_started": len(orders.lease_placed_at), "leases_seen_running": len(latencies),
        "readings_ingested": books["samples"], "console_frames": sum(c.frames for c in consoles),
        "console_reconnects": sum(c.reconnects for c in consoles),
        "console_errors": dict(sum((c.errors for c in consoles), Counter()).most_common(3)),
        "restarts": {name: n for name, n in watch.restarts.items() if n} or 0,
        "rss_mib": {name: [round(base / 2**20, 1), round(tail / 2**20, 1), round(100 * g, 1)]
                    for name, (base, tail, g) in core.items()},
        "agents_rss_growth_max_pct": round(100 * max((g for _, _, g in agents), default=0.0), 1),
        "rss_flat": all(g < 0.10 for _, _, g in growth.values()),
        "ledger_check": books["problems"],
    }


def report(result: dict) -> None:
    print(f"orders placed: {sum(result['orders_placed'].values())} {result['orders_placed']}")
    print(f"orders refused (4xx, the JSON error shape): {result['orders_refused']}; 5xx: {result['server_errors']}")
    for mode, reasons in result["refusal_reasons"].items():
        print(f"  {mode}: {reasons}")
    p50, p99 = result["order_to_running_p50_s"], result["order_to_running_p99_s"]
    print(f"order→running (on demand + spot, {result['leases_seen_running']} of {result['leases_started']} leases "
          f"seen running): p50 {p50 if p50 is None else f'{p50:.3f}'} s, p99 {p99 if p99 is None else f'{p99:.3f}'} s")
    print(f"GPU readings ingested: {result['readings_ingested']}; metrics frames on consoles: "
          f"{result['console_frames']} (reconnects {result['console_reconnects']})")
    print(f"process restarts: {result['restarts']}")
    for name, (base, tail, g) in result["rss_mib"].items():
        print(f"  RSS {name:8} {base:8.1f} MiB after warm-up → {tail:8.1f} MiB at the end ({g:+.1f}%)")
    print(f"  agents: largest RSS growth {result['agents_rss_growth_max_pct']:+.1f}%; flat (< 10%) everywhere: "
          f"{result['rss_flat']}")
    print(f"ledger_check(): {result['ledger_check'] or 'balanced'}")
    print(json.dumps(result))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="how long the load runs (default 30)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="minutes before the RSS baseline (default a fifth of the run, at most 5)")
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--order-every", type=float, default=2.0, help="seconds between orders (default 2)")
    ap.add_argument("--embedded", action="store_true",
                    help="the embedded default (SQLite, one web process) instead of PostgreSQL + Redis")
    arguments = ap.parse_args()
    if arguments.warmup is None:
        arguments.warmup = min(5.0, arguments.minutes / 5)
    report(soak(arguments))
