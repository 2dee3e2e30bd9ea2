"""Order latency: an order placed through the API until its lease runs, beside the bare agent round trip.

    .venv/bin/python bench/order_latency.py [--orders 200] [--agents 4]

Starts what `manage.py demo` starts for the web side — a real uvicorn server (config.asgi) on loopback with a
fresh database in a temporary folder (or DATABASE_URL's) — and real `python -m nodeagent --simulate
h100-80gb:8` processes. Then, in the same run:

- baseline: the bare agent command round trip, N times: a provider carves a 1g slice by hand
  (POST /api/v1/slices/) and polls it until the agent's result made it ready (create_instance there and back);
- orders: a buyer places N on-demand orders (POST /api/v1/orders/, memory_gb=10) one after another and polls
  each lease until it is running (validation, pricing, wallet check, snapshot, engine decision, claim, agent
  create, slice_ready → lease running).

Both poll every 2 ms, so the polling cost is in both. Prints p50/p99 of each and their ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.e2e.livestack import LiveStack, free_port, wait_until  # noqa: E402
POLL = 0.002


class Api:
    def __init__(self, base: str, key: str):
        self.base, self.key = base, key

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.base + path, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {self.key}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def wait(self, path: str, field: str, want: str, timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _, body = self.call("GET", path)
            if body.get(field) == want:
                return body
            time.sleep(POLL)
        raise TimeoutError(f"{path} never reached {field}={want}: {body}")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=int, default=200)
    ap.add_argument("--agents", type=int, default=4)
    args = ap.parse_args()
    var = Path(tempfile.mkdtemp(prefix="gpumarket-bench-"))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.dev", "GPUMARKET_VAR_DIR": str(var),
           "DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY", "bench-only-secret"),
           "API_THROTTLE_USER": "10000000/min", "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    os.environ.update(env)
    import django

    django.setup()
    from decimal import Decimal

    from django.core.management import call_command

    from marketplace.money import ledger
    from marketplace.products.apikeys import api_key_create
    from scheduler.models import Node
    from scheduler.services import nodes as node_services
    from tests.factories import ProviderFactory, UserFactory

    call_command("migrate", interactive=False, verbosity=0)
    provider, buyer = ProviderFactory(username="bench-provider"), UserFactory(username="bench-buyer")
    ledger.post(kind="topup", memo="bench", lines=[(ledger.platform_account("stripe_clearing"), Decimal("-100000")),
                                                   (ledger.account_for(user=buyer, kind="wallet"), Decimal("100000"))])
    tokens = [node_services.node_register(provider=provider, name=f"bench-{i}", price_per_gpu_hour="2.00")[1]
              for i in range(args.agents)]
    _, provider_key = api_key_create(user=provider, name="bench")
    _, buyer_key = api_key_create(user=buyer, name="bench")
    port = free_port()
    procs = []
    logs = var / "logs"
    logs.mkdir()

    def start(name, argv, extra=None):
        out = open(logs / f"{name}.log", "ab")
        procs.append(subprocess.Popen(argv, cwd=ROOT, env={**env, **(extra or {})}, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    try:
        py = sys.executable
        start("web", [py, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port),
                      "--ws", "config.wsprotocol:WebSocketProtocol", "--log-level", "warning"])
        wait_until(lambda: LiveStack._port_open_at(port), timeout=30, what="the web server")
        for i, token in enumerate(tokens):
            start(f"agent-{i}", [py, "-m", "nodeagent", "--server", f"ws://127.0.0.1:{port}/ws/agent/",
                                 "--simulate", "h100-80gb:8", "--hostname", f"bench-{i}.local", "--seed", str(i)],
                  {"NODEAGENT_TOKEN": token})
        deadline = time.monotonic() + 60
        while Node.objects.filter(status="online").count() < args.agents:
            if time.monotonic() > deadline:
                raise SystemExit(f"agents did not come online; see {logs}")
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}/api/v1"
        prov, buy = Api(base, provider_key), Api(base, buyer_key)
        gpus = [g["uuid"] for g in prov.call("GET", "/gpus/?limit=100")[1]["results"]]

        baseline = []
        for i in range(args.orders):
            t0 = time.perf_counter()
            status, body = prov.call("POST", "/slices/", {"gpu": gpus[i % len(gpus)], "profile": "1g.10gb"})
            assert status == 201, body
            prov.wait(f"/slices/{body['id']}/", "state", "ready")
            baseline.append(time.perf_counter() - t0)
            prov.call("DELETE", f"/slices/{body['id']}/")
            prov.wait(f"/slices/{body['id']}/", "state", "destroyed")

        latency = []
        for _ in range(args.orders):
            t0 = time.perf_counter()
            status, body = buy.call("POST", "/orders/", {"mode": "on_demand", "memory_gb": 10})
            assert status == 201, body
            buy.wait(f"/leases/{body['leases'][0]}/", "state", "running")
            latency.append(time.perf_counter() - t0)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    db = "PostgreSQL" if os.environ.get("DATABASE_URL") else "SQLite (WAL)"
    print(f"order latency: {args.orders} orders, {args.agents} simulated agents x 8 H100, {db}, loopback")
    for name, xs in (("agent round trip (baseline)", baseline), ("order -> lease running", latency)):
        print(f"  {name:<28} p50 {pct(xs, 50) * 1000:7.1f} ms   p99 {pct(xs, 99) * 1000:7.1f} ms   "
              f"mean {statistics.mean(xs) * 1000:7.1f} ms")
    print(f"  ratio order / baseline: p50 {pct(latency, 50) / pct(baseline, 50):.2f}x   "
          f"p99 {pct(latency, 99) / pct(baseline, 99):.2f}x   target p99 < 1 s: "
          f"{'met' if pct(latency, 99) < 1.0 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
