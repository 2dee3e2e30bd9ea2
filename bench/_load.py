"""Load generator for bench/metrics_ingest.py (one asyncio process, many agent connections).

modes:
  gateway  — N agents speak protocol v1 to /ws/agent/ (hello, then one metrics frame per interval with
             8 GPU samples); S console sockets subscribe to nodes and record send→receive latency.
  echo     — N connections send the same frames to the echo server and record the round trip.
`--interval 0` sends as fast as the server takes them (saturation). `--port` may list several web processes
(`8001,8002`): agent i speaks to process i mod n, console s to process s+1 mod n, so a console watches
agents of another process too. Prints one JSON line of results.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import websockets  # noqa: E402

from nodeagent import protocol  # noqa: E402
from nodeagent.backends.simulated import SimulatedBackend  # noqa: E402


def frames_for(hostname: str, gpus: int):
    backend = SimulatedBackend(f"h100-80gb:{gpus}", hostname=hostname, seed=1)
    inv = backend.inventory()
    hello = protocol.hello(hostname=hostname, agent_version="bench", backend="simulated",
                           driver_version=inv["driver_version"], cuda_version=inv["cuda_version"], gpus=inv["gpus"])
    return hello, backend.sample()


async def agent(url: str, token: str | None, hostname: str, gpus: int, interval: float, clock: dict, stats: dict,
                echo: bool, latencies: list):
    try:
        await _agent(url, token, hostname, gpus, interval, clock, stats, echo, latencies)
    except websockets.exceptions.ConnectionClosed as exc:
        # The server closed or dropped this socket mid-run: counted and reported, not a crash of the run.
        stats["closed"] += 1
        stats.setdefault("close_reasons", {}).setdefault(str(exc)[:80], 0)
        stats["close_reasons"][str(exc)[:80]] += 1


async def _agent(url: str, token: str | None, hostname: str, gpus: int, interval: float, clock: dict, stats: dict,
                 echo: bool, latencies: list):
    hello, samples = frames_for(hostname, gpus)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # No keepalive pings: under saturation a late pong would close the socket and end the measurement.
    async with websockets.connect(url, additional_headers=headers, max_queue=None, open_timeout=60,
                                  ping_interval=None) as ws:
        if not echo:
            await ws.send(protocol.encode(hello))
            welcome = json.loads(await ws.recv())
            assert welcome["type"] == "welcome", welcome
        stats["connected"] += 1
        await clock["go"].wait()
        stop = clock["stop"]

        async def reader():
            async for msg in ws:
                if echo:
                    frame = json.loads(msg)
                    latencies.append(time.time() - frame["ts"])
                    stats["echoed"] += len(frame["gpus"])
        reading = asyncio.create_task(reader())
        next_at = time.monotonic()
        while time.time() < stop:
            await ws.send(protocol.encode(protocol.metrics(ts=time.time(), gpus=samples)))
            stats["sent"] += len(samples)
            if interval > 0:
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            else:
                await asyncio.sleep(0)
        reading.cancel()
        if reading.done() and not reading.cancelled() and reading.exception():
            raise reading.exception()


async def console(url: str, session: str, origin: str, node_ids: list[str], clock: dict, latencies: list):
    async with websockets.connect(url, additional_headers={"Cookie": f"sessionid={session}", "Origin": origin},
                                  max_queue=None, open_timeout=60, ping_interval=None) as ws:
        for nid in node_ids:
            await ws.send(json.dumps({"subscribe": {"node": nid}}))
        await clock["go"].wait()
        stop, warmup_until = clock["stop"], clock["warm"]
        while time.time() < stop:
            try:
                msg = json.loads(await asyncio.wait_for(ws.recv(), timeout=max(0.1, stop - time.time())))
            except asyncio.TimeoutError:
                break
            if msg.get("type") == "metrics" and time.time() > warmup_until:
                latencies.append(time.time() - msg["sent"])


async def main(args) -> dict:
    seed = json.loads(Path(args.seed).read_text())
    nodes = seed["nodes"][: args.nodes]
    clock = {"go": asyncio.Event()}
    stats = {"connected": 0, "expected": len(nodes), "sent": 0, "echoed": 0, "closed": 0}
    latencies: list[float] = []
    tasks = []
    ports = [int(p) for p in args.port.split(",")]
    for i, node in enumerate(nodes):
        url = f"ws://127.0.0.1:{ports[i % len(ports)]}/ws/{'echo' if args.mode == 'echo' else 'agent'}/"
        if args.mode == "echo" and args.interval > 0:
            url += "?reply=1"  # at a fixed rate the echo comes back, for the latency
        tasks.append(asyncio.create_task(agent(url, node["token"], f"bench-{i}", args.gpus, args.interval, clock,
                                               stats, args.mode == "echo", latencies)))
        if i % 25 == 24:
            await asyncio.sleep(0.1)  # don't open 500 sockets in one burst
    if args.mode == "gateway" and args.subscribers:
        per = max(1, len(nodes) // args.subscribers)
        for s in range(args.subscribers):
            ids = [n["id"] for n in nodes[s * per:(s + 1) * per]][:50]
            port = ports[(s + 1) % len(ports)]
            tasks.append(asyncio.create_task(console(f"ws://127.0.0.1:{port}/ws/console/", seed["session"],
                                                     f"http://127.0.0.1:{port}", ids, clock, latencies)))
    deadline = time.time() + 120
    while stats["connected"] < len(nodes) and time.time() < deadline:
        failed = [t for t in tasks if t.done() and t.exception()]
        if failed:
            raise failed[0].exception()
        await asyncio.sleep(0.1)
    now = time.time()
    clock.update(warm=now + args.warmup, stop=now + args.warmup + args.seconds)
    print(json.dumps({"ready": now, "warm": clock["warm"], "stop": clock["stop"]}), flush=True)
    clock["go"].set()
    await asyncio.gather(*tasks)
    if args.mode == "echo":
        latencies = latencies[len(latencies) // 5:]  # drop the warm-up share
    latencies.sort()

    def pct(p):
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else None
    return {"connected": stats["connected"], "sent": stats["sent"], "echoed": stats["echoed"],
            "closed": stats["closed"], "close_reasons": stats.get("close_reasons", {}),
            "p50": pct(0.50), "p99": pct(0.99), "n_latency": len(latencies)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["gateway", "echo"], required=True)
    ap.add_argument("--port", required=True, help="a port, or several separated by commas")
    ap.add_argument("--seed", required=True)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--subscribers", type=int, default=10)
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
