"""Metering at scale: 10,000 running leases (synthetic, no agents) metered for 10 minutes of simulated ticks.

    DATABASE_URL=postgres://... .venv/bin/python bench/metering_scale.py [--leases 10000] [--minutes 10]

It creates its own test database (on DATABASE_URL's server; SQLite in memory without it), seeds nodes, GPUs,
buyers with money and running on-demand leases whose starts are spread over a minute, then calls the beat's
metering tick (marketplace.lifecycle.leases.meter_tick) every METER_SECONDS of simulated time. Measured in the
same run, as the baseline: one bare `UPDATE marketplace_lease ... WHERE id IN (...)` of every running lease (the
least a tick that wrote every lease could cost). Prints, and checks against the market-core targets:

- SQL statements per lease per tick, on average (target <= 1);
- SQL statements per lease per posted minute (target <= 3);
- a tick's wall time against its period (target: the slowest tick <= 10% of METER_SECONDS), and the mean tick
  as a ratio of the bare UPDATE;
- ledger_check() at the end (target: no problem), and that each lease was charged price x seconds exactly.
Exits 1 when a target is missed.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone as dt_timezone
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--buyers", type=int, default=1_000)
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment

    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        return run(args, settings, connection)
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


def seed(n_leases: int, n_buyers: int, t0: datetime):
    """Nodes of 8 L4s (whole GPUs, nothing to carve), buyers with 1,000 USD, one running lease per GPU, starts
    spread uniformly over the minute before t0."""
    from django.contrib.auth import get_user_model

    from marketplace.models import Lease, Mode, Order
    from marketplace.money import ledger
    from scheduler.models import Gpu, GpuModel, Node, Slice

    User = get_user_model()
    provider = User.objects.create(username="provider")
    buyers = User.objects.bulk_create([User(username=f"buyer{i}") for i in range(n_buyers)])
    ledger.post_many([ledger.Posting(kind="topup", memo="bench", lines=[
        ((None, "stripe_clearing"), Decimal("-1000")), ((b.pk, "wallet"), Decimal("1000"))]) for b in buyers])
    l4 = GpuModel.objects.get(key="l4")
    per_node = 8
    nodes = Node.objects.bulk_create([Node(provider=provider, name=f"n{i}", region="eu-west", status="online",
                                           token_hash=f"{i:064d}", token_prefix="bench", cuda_version="12.4",
                                           price_per_gpu_hour=Decimal("0.6000"))
                                      for i in range((n_leases + per_node - 1) // per_node)])
    gpus = Gpu.objects.bulk_create([Gpu(node=node, uuid=f"GPU-{node.pk}-{j}", index=j, name="NVIDIA L4",
                                        gpu_model=l4, memory_mib=23034)
                                    for node in nodes for j in range(per_node)][:n_leases])
    slices = Slice.objects.bulk_create([Slice(gpu=g, profile="", start=0, size=0, state="ready", ready_at=t0)
                                        for g in gpus])
    rnd = random.Random(7)
    orders = Order.objects.bulk_create([Order(buyer=buyers[i % n_buyers], mode=Mode.ON_DEMAND, state="placed",
                                              whole_gpu=True) for i in range(n_leases)])
    leases = []
    for i, (sl, order) in enumerate(zip(slices, orders)):
        start = (t0 - timedelta(seconds=rnd.randrange(0, 60))).replace(microsecond=0)
        leases.append(Lease(order=order, buyer_id=order.buyer_id, slice=sl, mode=Mode.ON_DEMAND, state="running",
                            price_per_hour=Decimal("1.080000"), started_at=start, accrued_until=start,
                            billed_until=start, metered=True))
    return [x.pk for x in Lease.objects.bulk_create(leases, batch_size=2000)]


def run(args, settings, connection) -> int:
    from marketplace.lifecycle import leases as lifecycle
    from marketplace.models import Lease, LedgerTransaction
    from marketplace.money.check import ledger_check

    period = float(settings.MARKET["METER_SECONDS"])
    t0 = datetime(2026, 11, 2, 9, 0, tzinfo=dt_timezone.utc)
    print(f"database: {connection.vendor}; seeding {args.leases:,} running leases for {args.buyers:,} buyers ...",
          flush=True)
    ids = seed(args.leases, args.buyers, t0)
    # A worker process holds none of the seed's objects: collect them, so the ticks' times are not the
    # garbage collector walking ten thousand model instances the bench made.
    gc.collect()

    # Baseline, same run: one bare UPDATE of every running lease by id.
    base = []
    for _ in range(5):
        t = time.perf_counter()
        Lease.objects.filter(pk__in=ids).update(warned_at=None)
        base.append(time.perf_counter() - t)
    baseline = statistics.median(base)

    statements = {"n": 0}

    def count(execute, sql, params, many, context):
        statements["n"] += 1
        return execute(sql, params, many, context)

    ticks, walls, per_tick = 0, [], []
    posted_minutes = 0
    with connection.execute_wrapper(count):
        now = t0
        end = t0 + timedelta(minutes=args.minutes)
        while now < end:
            now += timedelta(seconds=period)
            before = statements["n"]
            t = time.perf_counter()
            posted_minutes += lifecycle.meter_tick(now=now)
            walls.append(time.perf_counter() - t)
            per_tick.append(statements["n"] - before)
            ticks += 1
    # Post what is left, as the end of every lease would (not counted in the ticks).
    for lease_id in ids:
        lifecycle.lease_end(lease_id=lease_id, at=end)

    problems = ledger_check()
    wrong = 0
    for lease in Lease.objects.filter(pk__in=ids).only("started_at", "price_per_hour", "cost_charged"):
        seconds = int((end - lease.started_at).total_seconds())
        expected = (lease.price_per_hour * seconds / Decimal(3600)).quantize(Decimal("0.000001"))
        wrong += lease.cost_charged != expected
    usage_rows = LedgerTransaction.objects.filter(kind="usage").count()

    n = args.leases
    total = sum(per_tick)
    per_lease_tick = total / (ticks * n)
    per_posted_minute = total / max(1, posted_minutes)
    slowest, mean = max(walls), statistics.mean(walls)
    p99 = sorted(walls)[int(0.99 * (len(walls) - 1))]
    print(f"ticks: {ticks} of {period:g} s over {args.minutes} min; lease-minutes posted: {posted_minutes:,}; "
          f"usage ledger rows: {usage_rows:,} ({usage_rows / n:.1f} per lease)")
    print(f"baseline (bare UPDATE of {n:,} leases by id): {baseline * 1000:.1f} ms")
    print(f"tick wall: mean {mean * 1000:.1f} ms ({mean / baseline:.2f}x the baseline), p99 {p99 * 1000:.1f} ms, "
          f"slowest {slowest * 1000:.1f} ms = {slowest / period:.1%} of the period")
    print(f"statements: {total:,} in ticks; {per_lease_tick:.4f} per lease per tick; "
          f"{per_posted_minute:.4f} per lease per posted minute")
    checks = [
        ("<= 1 statement per lease per tick", per_lease_tick <= 1),
        ("<= 3 statements per lease per posted minute", per_posted_minute <= 3),
        ("slowest tick <= 10% of its period", slowest <= 0.10 * period),
        ("ledger_check() == []", not problems),
        ("every lease charged price x seconds exactly", wrong == 0),
    ]
    for label, ok in checks:
        print(f"  {'PASS' if ok else 'MISS'}  {label}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
