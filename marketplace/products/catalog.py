"""The catalog: offers (units) = GPU model × slice profile (or whole GPU) × region, aggregated from online
nodes' schedulable GPUs with the geometry their agents reported. Each offer carries how many could be placed
now, performance units, the price of each mode (DESIGN §5), $ per PU-hour, reliability and its spot
interruption history. Node-level filters (CUDA, region) and the GPU's own reliability apply before aggregation, so an offer's
availability and prices count only the nodes that pass them. It reads the shared pool snapshot
(claims/snapshot.py, at most SNAPSHOT_TTL_SECONDS old) and prices through pricing.price_for: a handful of
queries whatever the fleet size, none at all while the snapshot is fresh but the listings and interruptions.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from marketplace.amounts import micro
from marketplace.claims import snapshot
from marketplace.claims.holds import reservation_holds
from marketplace.models import Interruption, ResaleListing
from marketplace.pricing import price_for, spot_factor_for
from nodeagent.hardware import mig as core_mig
from scheduler.core import perf
from scheduler.core.filters import version_tuple
from nodeagent.hardware.gpus import GPU_MODELS

WHOLE = "whole"
SORTS = {"price", "pu_per_dollar", "reliability", "availability", "memory_gb", "pu"}


@dataclass
class Filters:
    gpu_model: str | None = None
    min_memory_gb: float | None = None
    min_cuda: str | None = None
    min_compute_capability: str | None = None
    region: str | None = None
    max_price: Decimal | None = None
    min_reliability: float | None = None
    mode: str = "on_demand"
    min_pu_per_dollar: float | None = None
    available_only: bool = False
    ordering: str = "price"


@dataclass
class Offer:
    gpu_model: str
    profile: str
    region: str
    memory_gb: float
    compute_capability: str
    pu: float
    availability: int = 0
    gpus: int = 0
    cuda_version: str = ""
    reliability: float = 0.0
    prices: dict = field(default_factory=dict)  # mode -> Decimal per hour (the cheapest node)
    interruptions: dict = field(default_factory=dict)
    compute_slices: int | None = None  # of the MIG profile (None: a whole GPU that is not split)
    base: tuple | None = None  # (base price, geometry, profile) of the node the prices are of: price_for's input
    _rel: list = field(default_factory=list, repr=False)

    def price_at(self, mode: str, *, spot_factor: Decimal | None = None) -> Decimal:
        """This unit's price in `mode` at its priced node (a spot price at any recorded factor)."""
        base, geometry, profile = self.base
        return price_for(mode=mode, base_per_gpu_hour=base, geometry=geometry, profile=profile,
                         spot_factor=spot_factor)

    @property
    def key(self) -> str:
        return f"{self.gpu_model}:{self.profile}:{self.region}"

    def price(self, mode: str) -> Decimal | None:
        return self.prices.get(mode)

    def pu_per_dollar(self, mode: str = "on_demand") -> float | None:
        p = self.price(mode)
        return round(self.pu / float(p), 4) if p else None

    def usd_per_pu_hour(self, mode: str = "on_demand") -> Decimal | None:
        p = self.price(mode)
        return micro(p / Decimal(str(self.pu))) if p is not None and self.pu else None


def _free_count(geometry: core_mig.MigGeometry, layout: tuple, profile: str) -> int:
    """How many more instances of `profile` fit on a GPU with `layout` (first legal start each time)."""
    insts = [core_mig.Instance(p, s) for p, s in layout]
    n = 0
    while True:
        starts = core_mig.legal_starts(geometry, insts, profile)
        if not starts:
            return n
        insts.append(core_mig.Instance(profile, starts[0]))
        n += 1


def offer_list(*, filters: Filters, now: datetime | None = None) -> list[Offer]:
    """The offers passing `filters`, sorted by `filters.ordering` ("price", "-availability", ...)."""
    now = now or timezone.now()
    ms = snapshot.cached()
    start, end = now, now + timedelta(seconds=1)
    held = reservation_holds(start=start, end=end)
    # The aggregation depends on the snapshot, the windows reserved now and the node-level filters only: made
    # once per snapshot for each of those (the shared snapshot lives SNAPSHOT_TTL_SECONDS).
    key = ("offers", filters.gpu_model, filters.region, filters.min_reliability, filters.min_cuda,
           filters.min_compute_capability, filters.min_memory_gb,
           tuple(sorted((h.gpu_id, h.profile or "", h.start) for h in held)))

    def aggregate():
        with snapshot.view(ms, start=start, end=end, held=held) as snap:
            return _aggregate(snap, filters)

    out = [replace(o, prices=dict(o.prices), interruptions={}) for o in ms.remember(key, aggregate).values()]
    _decorate(out, now, ms.pool.spot_factors)
    out = [o for o in out if _offer_passes(filters, o)]
    return _sorted(out, filters)


def _aggregate(snap, filters: Filters) -> dict[tuple, Offer]:
    offers: dict[tuple, Offer] = {}
    counts: dict[tuple, int] = {}
    records = snap.pool.by_model.get(filters.gpu_model, []) if filters.gpu_model else snap.pool.records
    for rec in records:
        node, gpu = snap.nodes[rec.node.id], rec.gpu
        if gpu.health == "cordoned" or not _node_passes(filters, node, rec.node.cuda_version):
            continue
        reliability = node.reliability if gpu.reliability is None else gpu.reliability
        if filters.min_reliability is not None and reliability + 1e-9 < filters.min_reliability:
            continue  # the GPU's own score (a node's GPUs differ: one threw XIDs, the others did not)
        spec = GPU_MODELS[gpu.model]
        if filters.min_compute_capability and version_tuple(spec.compute_capability) < version_tuple(
                filters.min_compute_capability):
            continue
        units = ([(p.name, p) for p in gpu.geometry.profiles] if gpu.geometry else [(WHOLE, None)])
        for name, prof in units:
            memory = prof.memory_gb if prof else spec.memory_gb
            if filters.min_memory_gb and memory + 1e-9 < filters.min_memory_gb:
                continue
            key = (gpu.model, name, node.region)
            if prof is not None:
                ck = (gpu.model, name, tuple(sorted((i.profile, i.start) for i in gpu.instances if i.profile)))
                free = counts[ck] if ck in counts else counts.setdefault(ck, _free_count(
                    gpu.geometry, ck[2], name))
                if any(i.profile is None for i in gpu.instances):
                    free = 0
            else:
                free = 0 if gpu.instances else 1
            o = offers.get(key)
            if o is None:
                pu = perf.profile_pu(spec, prof) if prof else perf.gpu_pu(spec)
                o = offers[key] = Offer(gpu_model=gpu.model, profile=name, region=node.region, memory_gb=memory,
                                        compute_capability=spec.compute_capability, pu=pu,
                                        compute_slices=prof.compute_slices if prof else None)
            o.availability += free
            o.gpus += 1
            o._rel.append(reliability)
            o.cuda_version = max(o.cuda_version, node.cuda_version or "", key=lambda v: version_tuple(v or "0"))
            _price_node(o, node=node, geometry=gpu.geometry, profile=prof.name if prof else None,
                        available=free > 0)
    return offers


def _node_passes(f: Filters, node, cuda: str) -> bool:
    if f.region and node.region != f.region:
        return False
    if f.min_cuda and version_tuple(cuda or "0") < version_tuple(f.min_cuda):
        return False
    return True


def _price_node(o: Offer, *, node, geometry, profile, available: bool) -> None:
    """Keep the cheapest node's prices, preferring nodes with capacity free now."""
    od = price_for(mode="on_demand", base_per_gpu_hour=node.price_per_gpu_hour, geometry=geometry, profile=profile)
    best = o.prices.get("_od")
    better = (best is None or (available and not o.prices.get("_avail")) or
              (available == bool(o.prices.get("_avail")) and od < best))
    if not better:
        return
    base = node.price_per_gpu_hour
    o.prices.update({"_od": od, "_avail": available, "_base": (base, geometry, profile), "on_demand": od,
                     "reserved": price_for(mode="reserved", base_per_gpu_hour=base, geometry=geometry,
                                           profile=profile),
                     "reserved_short_notice": price_for(mode="reserved_short_notice", base_per_gpu_hour=base,
                                                        geometry=geometry, profile=profile)})


def _decorate(offers: list[Offer], now: datetime, factors: dict) -> None:
    """Spot and resale prices, reliability and interruption history (one query each)."""
    asks: dict[tuple, Decimal] = {}
    for m, p, r, ask in ResaleListing.objects.filter(state=ResaleListing.State.OPEN, starts_at__gte=now).values_list(
            "gpu_model", "profile", "region", "ask_per_hour"):
        k = (m, p, r)
        asks[k] = min(asks.get(k, ask), ask)
    history: dict[tuple, list] = defaultdict(list)
    for m, p, r, kind, at, notice in Interruption.objects.filter(announced_at__gte=now - timedelta(days=30)).values_list(
            "gpu_model", "profile", "region", "kind", "announced_at", "notice_seconds").order_by("-announced_at"):
        history[(m, p, r)].append((kind, at, notice))
    for o in offers:
        o.base = o.prices.pop("_base")
        o.prices.pop("_od", None), o.prices.pop("_avail", None)
        o.prices["spot"] = o.price_at("spot", spot_factor=spot_factor_for(model=o.gpu_model, known=factors))
        if (o.gpu_model, o.profile, o.region) in asks:
            o.prices["resale"] = asks[(o.gpu_model, o.profile, o.region)]
        o.reliability = round(sum(o._rel) / len(o._rel), 4) if o._rel else 0.0
        events = history.get((o.gpu_model, o.profile, o.region), [])
        o.interruptions = {"last_30_days": len(events),
                           "recent": [{"kind": k, "at": at.isoformat(), "notice_seconds": n} for k, at, n in events[:5]]}


def _offer_passes(f: Filters, o: Offer) -> bool:
    price = o.price(f.mode)
    if price is None:
        return False  # e.g. no resale listing for this unit
    if f.max_price is not None and price > f.max_price:
        return False
    if f.min_pu_per_dollar is not None and (o.pu_per_dollar(f.mode) or 0) < f.min_pu_per_dollar:
        return False
    if f.available_only and (o.availability <= 0 and f.mode != "resale"):
        return False
    return True


def _sorted(offers: list[Offer], f: Filters) -> list[Offer]:
    desc = f.ordering.startswith("-")
    name = f.ordering.lstrip("-")
    keys = {
        "price": lambda o: o.price(f.mode) or Decimal("0"),
        "pu_per_dollar": lambda o: o.pu_per_dollar(f.mode) or 0.0,
        "reliability": lambda o: o.reliability,
        "availability": lambda o: o.availability,
        "memory_gb": lambda o: o.memory_gb,
        "pu": lambda o: o.pu,
    }
    return sorted(offers, key=lambda o: (keys[name](o), o.key), reverse=desc)
