"""Pool snapshots for the market: one base snapshot of the pool now, viewed per order.

The base snapshot is every online GPU with its active slices classified by the open leases (3 fleet queries,
one of the leases, one of the spot factors; one of the recent orders for the demand mix, at most once a
minute: demand.py), built into the engine's indexed `Pool` — the expensive part at 10,000 GPUs. An order sees
it through `view`: the reserved windows overlapping the order's span become held slots, and for a future
window the slices gone by then are left out; the view changes only the GPUs it must (`Pool.overlay`) and puts
them back after the decision. So:

- read paths (the catalog, each keystroke of the order preview) share one base snapshot for
  SNAPSHOT_TTL_SECONDS, refreshed in the background (`cached`); a stale view only shows a slice seconds late;
- the queue retry builds one for its whole batch (`fresh` once, again after a placement);
- a placement decides on a fresh one, and its claim re-checks under the GPU locks, so nothing stale is taken.
The shared snapshot is guarded by a lock: a view mutates the pool while it lasts.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterator

from marketplace.conf import market, price_rules
from marketplace.pricing import spot_factors
from scheduler.services.allocation import Snapshot, placed, pool_snapshot, with_holds

from .demand import learnt_mix
from .holds import LeaseClasses, reservation_holds

log = logging.getLogger(__name__)


@dataclass
class MarketSnapshot:
    """A base snapshot and what it was built from."""

    snapshot: Snapshot
    leases: LeaseClasses
    built_at: float = field(default_factory=time.monotonic)
    lock: threading.RLock = field(default_factory=threading.RLock)
    # What read paths derived from this snapshot (the catalog's aggregation per filter and reserved windows):
    # it lives and dies with the snapshot.
    memo: dict = field(default_factory=dict)

    def remember(self, key, make):
        """memo[key], made by `make()` the first time (a few hundred keys at most)."""
        with self.lock:
            if key not in self.memo:
                if len(self.memo) > 256:
                    self.memo.clear()
                self.memo[key] = make()
            return self.memo[key]

    @property
    def pool(self):
        return self.snapshot.pool


def fresh() -> MarketSnapshot:
    """The pool now: online GPUs, active slices as the open leases classify them, no reserved windows; the
    engine weighs packing by the demand the market has seen (claims/demand.py)."""
    leases = LeaseClasses()
    snap = pool_snapshot(classify=leases.occupant, rules=price_rules(), spot_factors=spot_factors(),
                         mix=learnt_mix())
    return MarketSnapshot(snapshot=snap, leases=leases)


_shared: MarketSnapshot | None = None
_shared_lock = threading.Lock()
_refreshing = threading.Event()


def cached(*, max_age: float | None = None) -> MarketSnapshot:
    """The shared base snapshot for read paths, at most SNAPSHOT_TTL_SECONDS old. Past its age a new one is
    built in a background thread while readers keep the current one, so no reader waits for a rebuild (10,000
    GPUs take about a second) but the first of a process, or one after the refresh has been stuck for ten
    times the TTL. A TTL of 0 builds one for every call (tests)."""
    global _shared
    ttl = market("SNAPSHOT_TTL_SECONDS") if max_age is None else max_age
    with _shared_lock:
        current = _shared
        age = time.monotonic() - current.built_at if current is not None else None
        if current is None or ttl <= 0 or age > max(10 * ttl, 30.0):
            _shared = current = fresh()
            return current
        if age > ttl and not _refreshing.is_set():
            _refreshing.set()
            threading.Thread(target=_refresh, name="market-snapshot", daemon=True).start()
        return current


def _refresh() -> None:
    global _shared
    from django.db import connections

    try:
        snap = fresh()
        with _shared_lock:
            _shared = snap
    except Exception:  # a failed refresh leaves the current snapshot; the next reader past the TTL retries
        log.exception("the market's shared snapshot could not be refreshed")
    finally:
        _refreshing.clear()
        connections.close_all()  # this thread's connections


def forget() -> None:
    """Drop the shared snapshot (tests; a process that wants the next read exact)."""
    global _shared
    with _shared_lock:
        _shared = None


@contextmanager
def view(ms: MarketSnapshot, *, start: datetime, end: datetime, window_start: datetime | None = None,
         exclude: tuple = (), held: list | None = None) -> Iterator[Snapshot]:
    """`ms` as a placement over [start, end) sees it: live reserved windows overlapping the span (but those in
    `exclude`) are held slots; with `window_start` (a booking), slices gone by then do not count. `held`: those
    windows, when the caller has read them already."""
    pool = ms.snapshot.pool
    holds: dict[int, list] = {}
    for h in reservation_holds(start=start, end=end, exclude=exclude) if held is None else held:
        holds.setdefault(h.gpu_id, []).append(h)
    uuid_of = {pk: uuid for uuid, pk in ms.snapshot.gpu_ids.items()}
    changed = {uuid_of[g] for g in holds if g in uuid_of}
    if window_start is not None:
        changed |= {uuid for uuid, slices in ms.snapshot.slices.items()
                    if any(ms.leases.leaves_before(sl, window_start) for sl in slices)}
    changes = {}
    for uuid in changed:
        geometry = pool.gpu(uuid).geometry
        instances = placed(geometry, ms.snapshot.slices[uuid],
                           lambda sl: ms.leases.occupant(sl, window_start=window_start))
        changes[uuid] = with_holds(geometry, instances, holds.get(ms.snapshot.gpu_ids[uuid], ()))
    with ms.lock, pool.overlay(changes):
        yield ms.snapshot
