"""Spot: a price per GPU model between 50% and 70% of on demand that follows the free share of that model's
pool (scheduler.core.pricing.spot_factor), kept as history; leases interrupted when the price passes their
bid or a higher class needs the capacity, always with a notice (socket, webhook, agent), billing stopped at
the interruption, and an automatic credit when the notice was shorter than promised.
"""
from __future__ import annotations

import statistics
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from marketplace.models import Interruption, Lease, Mode, SpotBid, SpotPrice
from marketplace.services import ledger
from scheduler.core import pricing
from scheduler.core.model import Request
from scheduler.core.mig import MigGeometry, smallest_fitting_profile
from scheduler.models import Gpu, Node
from scheduler.services import allocation
from scheduler.services.commands import command_issue

from .capacity import cents, lease_classifier, market, on_demand_price, spot_factor_now, spot_price
from .metering import meter_settle
from .notify import notify_webhook, tell_buyer


def spot_factor_for(*, model: str) -> Decimal:
    """The latest recorded spot factor of `model` (the cheapest, 50%, before any history exists)."""
    latest = SpotPrice.objects.filter(gpu_model=model).order_by("-at").values_list("factor", flat=True).first()
    return latest if latest is not None else spot_factor_now(free_share=1.0)


def bid_cap(*, request: Request) -> Decimal | None:
    """The highest on-demand price of any unit in the catalog that could serve `request` (a bid above it is
    pointless): every registered node's present GPUs of the allowed models and regions, online or not, so an
    order that queues because nothing is free (or nothing is online) is capped like one placed at once.
    None when no GPU anywhere could serve it."""
    gpus = Gpu.objects.filter(present=True, gpu_model__isnull=False)
    if request.models is not None:
        gpus = gpus.filter(gpu_model__key__in=list(request.models))
    if request.regions is not None:
        gpus = gpus.filter(node__region__in=list(request.regions))
    best = None
    # One row per distinct (price, model, MIG layout): a fleet of identical GPUs is priced once.
    for price, key, memory_gb, mig_enabled, geometry_dict in (
            gpus.values_list("node__price_per_gpu_hour", "gpu_model__key", "gpu_model__memory_gb", "mig_enabled",
                             "mig_geometry").distinct()):
        geometry = MigGeometry.from_dict(geometry_dict) if mig_enabled and geometry_dict else None
        if request.wants_whole or geometry is None:
            if float(memory_gb) + 1e-9 < request.memory_gb:
                continue
            profile = None
        else:
            fit = smallest_fitting_profile(geometry, memory_gb=request.memory_gb,
                                           compute_slices=request.compute_slices)
            if fit is None:
                continue
            profile = fit.name
        od = on_demand_price(node=Node(price_per_gpu_hour=price), geometry=geometry, profile=profile)
        best = od if best is None else max(best, od)
    return best


def spot_interrupt(*, lease_id, kind: str, now: datetime | None = None, deadline: datetime | None = None
                   ) -> Interruption | None:
    """Interrupt a spot lease with a notice ending at `deadline` (default: the full notice from now)."""
    now = now or timezone.now()
    required = market("SPOT_NOTICE_SECONDS")
    deadline = deadline or now + timedelta(seconds=required)
    with transaction.atomic():
        # Lock the lease: the race is two interrupters (price tick, preemption, reservation) or the meter.
        lease = (Lease.objects.select_for_update(of=("self",))
                 .select_related("slice__gpu__node", "slice__gpu__gpu_model", "order", "buyer")
                 .filter(pk=lease_id, mode=Mode.SPOT).first())
        if lease is None or lease.state not in (Lease.State.RUNNING, Lease.State.PROVISIONING):
            return None
        given = max(0.0, (deadline - now).total_seconds())
        was_running = lease.state == Lease.State.RUNNING
        if was_running:
            meter_settle(lease=lease, now=now)  # billing stops at the interruption
        lease.state, lease.ends_at = Lease.State.INTERRUPTING, deadline
        lease.save(update_fields=["state", "ends_at"])
        sl, gpu = lease.slice, lease.slice.gpu
        intr = Interruption.objects.create(
            lease=lease, kind=kind, announced_at=now, deadline=deadline, notice_seconds=given,
            required_notice_seconds=required, gpu_model=gpu.gpu_model.key if gpu.gpu_model else "",
            profile=sl.profile or "whole", region=gpu.node.region)
        if was_running and given + 1e-6 < required:
            amount = cents(lease.price_per_hour * market("SHORT_NOTICE_CREDIT_HOURS"))
            if amount > 0:
                ledger.credit(user=lease.buyer, amount=amount, idempotency_key=f"notice-credit:{lease.pk}",
                              memo=f"short spot notice ({given:.0f}s of {required:.0f}s) on lease {str(lease.pk)[:8]}",
                              lease=lease.pk, order=lease.order_id)
                intr.credited = amount
                intr.save(update_fields=["credited"])
        SpotBid.objects.filter(order_id=lease.order_id).update(state=SpotBid.State.OUTBID)
        payload = {"type": "interruption", "lease": str(lease.pk), "kind": kind, "deadline": deadline.isoformat(),
                   "notice_seconds": round(given, 3), "instance_uuid": sl.instance_uuid or gpu.uuid,
                   "credited": str(intr.credited)}
        tell_buyer(lease.buyer_id, payload)
        notify_webhook(user_id=lease.buyer_id, kind="interruption", payload=payload,
                       order_webhook=lease.order.webhook_url if lease.order else "")
        if gpu.node.status == Node.Status.ONLINE:
            command_issue(node=gpu.node, op="notice", args={"kind": f"spot_interruption:{kind}",
                                                            "deadline": deadline.isoformat(),
                                                            "instance_uuid": sl.instance_uuid or gpu.uuid})
    return intr


def spot_prices_recompute(*, now: datetime | None = None) -> int:
    """Beat: record each model's spot price from its pool's free share, then reprice running spot leases,
    interrupting those whose new price passes their bid. Returns the number of models priced."""
    now = now or timezone.now()
    snap = allocation.pool_snapshot(classify=lease_classifier())
    factors: dict[str, Decimal] = {}
    rows = []
    for model, recs in snap.pool.by_model.items():
        free = snap.pool.free_share(model)
        factor = factors[model] = spot_factor_now(free_share=free)
        base = Decimal(str(statistics.median(r.node.price_per_gpu_hour for r in recs)))
        od_factor = Decimal(str(pricing.ON_DEMAND_FACTOR))
        rows.append(SpotPrice(gpu_model=model, at=now, factor=factor, free_share=free,
                              price_per_gpu_hour=(base * od_factor * factor).quantize(Decimal("0.000001"))))
    SpotPrice.objects.bulk_create(rows)
    for lease in (Lease.objects.filter(mode=Mode.SPOT, state__in=[Lease.State.RUNNING, Lease.State.PROVISIONING])
                  .select_related("slice__gpu__node", "slice__gpu__gpu_model", "order")):
        gpu = lease.slice.gpu
        factor = factors.get(gpu.gpu_model.key if gpu.gpu_model else "")
        if factor is None:
            continue
        new = spot_price(node=gpu.node, geometry=gpu.geometry(), profile=lease.slice.profile or None, factor=factor)
        # A k-GPU order's bid (each lease's bid_per_hour) is for its k GPUs together, k alike on one node.
        k = lease.order.gpu_count if lease.order is not None else 1
        if lease.bid_per_hour is not None and new * k > lease.bid_per_hour:
            spot_interrupt(lease_id=lease.pk, kind=Interruption.Kind.PRICE, now=now)
        elif new != lease.price_per_hour:
            _reprice(lease_id=lease.pk, price=new, now=now)
    return len(rows)


def _reprice(*, lease_id, price: Decimal, now: datetime) -> None:
    with transaction.atomic():
        # Lock the lease: the seconds before the change are billed at the old price, exactly once.
        lease = (Lease.objects.select_for_update(of=("self",))
                 .select_related("slice__gpu__node__provider", "slice__gpu__gpu_model", "buyer")
                 .filter(pk=lease_id, state__in=[Lease.State.RUNNING, Lease.State.PROVISIONING]).first())
        if lease is None:
            return
        if lease.state == Lease.State.RUNNING:
            meter_settle(lease=lease, now=now)
        lease.price_per_hour = price
        lease.save(update_fields=["price_per_hour"])


def interruption_history(*, gpu_model: str | None = None, since: datetime | None = None):
    qs = Interruption.objects.all()
    if gpu_model:
        qs = qs.filter(gpu_model=gpu_model)
    if since:
        qs = qs.filter(announced_at__gte=since)
    return qs
