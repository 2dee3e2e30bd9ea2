"""Orders: validated, priced, checked against the wallet, handed to the scheduler, and turned into a lease
(on demand, spot), a reservation (reserved) or a bought window (resale). An order that cannot be placed now
waits in the queue with the engine's reasons, or is refused at once, as the buyer chose; the beat retries
the queue by priority, then first come first served.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.utils import timezone

from marketplace.models import Lease, Mode, Order, Project, SpotBid
from marketplace.services import ledger
from scheduler.errors import Conflict, DomainError, NotFound
from scheduler.models import GpuModel
from scheduler.services import allocation

from . import capacity
from .capacity import market

MAX_PRICE = Decimal("100000")


@dataclass
class OrderSpec:
    """What a buyer asks for (the API's serializer fills it; the service checks the domain rules)."""

    mode: str
    gpu_models: list[str] | tuple = ()
    memory_gb: float = 0
    compute_slices: int = 1
    whole_gpu: bool = False
    gpu_count: int = 1
    min_cuda: str = ""
    min_compute_capability: str = ""
    regions: list[str] | tuple = ()
    buyer_region: str = ""
    duration_seconds: int | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    max_price_per_hour: Decimal | None = None
    priority: int = 0
    if_unavailable: str = Order.IfUnavailable.FAIL
    webhook_url: str = ""
    listing_id: object = None
    project_id: object = None


def _check(spec: OrderSpec, now: datetime) -> None:
    if spec.mode not in Mode.values:
        raise DomainError(f"mode is one of {', '.join(Mode.values)}", field="mode")
    if spec.if_unavailable not in Order.IfUnavailable.values:
        raise DomainError("if_unavailable is 'queue' or 'fail'", field="if_unavailable")
    if spec.gpu_models:
        known = set(GpuModel.objects.filter(key__in=list(spec.gpu_models)).values_list("key", flat=True))
        unknown = sorted(set(spec.gpu_models) - known)
        if unknown:
            raise DomainError(f"unknown GPU model {unknown[0]!r}", field="gpu_models")
    if spec.memory_gb < 0 or spec.memory_gb > 1000:
        raise DomainError("memory_gb is between 0 and 1000", field="memory_gb")
    if spec.compute_slices < 1 or spec.compute_slices > 8:
        raise DomainError("compute_slices is between 1 and 8", field="compute_slices")
    if isinstance(spec.gpu_count, bool) or not isinstance(spec.gpu_count, int) or not 1 <= spec.gpu_count <= 8:
        raise DomainError("gpu_count is between 1 and 8", field="gpu_count")
    if spec.gpu_count > 1:
        if spec.mode in (Mode.RESERVED, Mode.RESALE):
            raise DomainError(f"a {Mode(spec.mode).label} order is one GPU or slice: gpu_count must be 1",
                              field="gpu_count")
        if spec.compute_slices != 1:
            raise DomainError("gpu_count > 1 means whole GPUs: leave compute_slices out (a MIG slice request)",
                              field="gpu_count")
    if spec.duration_seconds is not None and not (0 < spec.duration_seconds <= market("MAX_DURATION_SECONDS")):
        raise DomainError(f"duration_seconds is between 1 and {market('MAX_DURATION_SECONDS')}",
                          field="duration_seconds")
    if spec.max_price_per_hour is not None:
        try:
            ok = spec.max_price_per_hour.is_finite() and 0 <= spec.max_price_per_hour <= MAX_PRICE
        except (AttributeError, InvalidOperation):
            ok = False
        if not ok:
            raise DomainError(f"max_price_per_hour is between 0 and {MAX_PRICE}", field="max_price_per_hour")
    if spec.mode == Mode.RESERVED:
        if spec.window_start is None or spec.window_end is None:
            raise DomainError("a reservation needs window_start and window_end", field="window_start")
        if spec.window_start < now - timedelta(seconds=60):
            raise DomainError("the window starts in the past", field="window_start")
        if spec.window_end <= spec.window_start:
            raise DomainError("the window must end after it starts", field="window_end")
        if (spec.window_end - spec.window_start).total_seconds() > market("MAX_DURATION_SECONDS"):
            raise DomainError("the window is too long", field="window_end")
    elif spec.window_start or spec.window_end:
        raise DomainError("only reserved orders take a window", field="window_start")
    if spec.webhook_url:
        from .notifications import webhook_url_check

        webhook_url_check(spec.webhook_url)
    if spec.mode == Mode.SPOT and not spec.max_price_per_hour:
        raise DomainError("a spot order needs a bid: max_price_per_hour > 0", field="max_price_per_hour")
    if spec.mode == Mode.RESALE and not spec.listing_id:
        raise DomainError("a resale purchase names the listing", field="listing")


def _project(*, buyer, project_id) -> Project | None:
    """The buyer's own project named by the order, or NotFound: someone else's id looks like a missing one."""
    if project_id in (None, ""):
        return None
    try:
        return Project.objects.get(pk=int(project_id), user=buyer)
    except (Project.DoesNotExist, TypeError, ValueError):
        raise NotFound("no such project among yours", field="project") from None


def order_place(*, buyer, spec: OrderSpec, now: datetime | None = None) -> Order:
    """Validate, price and place an order (or queue it, or refuse it with the engine's reasons)."""
    now = now or timezone.now()
    _check(spec, now)
    project = _project(buyer=buyer, project_id=spec.project_id)
    if spec.mode == Mode.RESALE:
        from .resale import listing_purchase

        return listing_purchase(buyer=buyer, listing_id=spec.listing_id, now=now, project=project).order
    with transaction.atomic():
        order = Order.objects.create(
            buyer=buyer, mode=spec.mode, if_unavailable=spec.if_unavailable, gpu_models=list(spec.gpu_models),
            memory_gb=spec.memory_gb, compute_slices=spec.compute_slices,
            whole_gpu=spec.whole_gpu or spec.gpu_count > 1, gpu_count=spec.gpu_count,
            min_cuda=spec.min_cuda, min_compute_capability=spec.min_compute_capability, regions=list(spec.regions),
            buyer_region=spec.buyer_region, duration_seconds=spec.duration_seconds, window_start=spec.window_start,
            window_end=spec.window_end, max_price_per_hour=spec.max_price_per_hour, priority=spec.priority,
            webhook_url=spec.webhook_url, project=project)
        if spec.mode == Mode.SPOT:
            SpotBid.objects.create(buyer=buyer, order=order, max_price_per_hour=spec.max_price_per_hour)
        placed = _try_place(order=order, now=now, first=True)
        if not placed and order.if_unavailable == Order.IfUnavailable.FAIL:
            raise Conflict(f"no capacity for this order now: {order.explain}", code="unavailable",
                           details={"reasons": order.reasons, "explain": order.explain})
    return order


def _try_place(*, order: Order, now: datetime, first: bool = False) -> bool:
    """One placement attempt for `order` (locked or just created). True when placed."""
    order.attempts += 1
    snapshot_now = lambda: capacity.snapshot_for(order=order, now=now)  # noqa: E731
    request = capacity.request_for(order)
    if order.mode == Mode.RESERVED:
        from .reservations import reservation_book

        placed = reservation_book(order=order, snapshot=snapshot_now, request=request, now=now)
        if not placed:
            order.save(update_fields=["attempts", "reasons", "explain"])
        return placed
    if first and order.mode == Mode.SPOT:
        from .spot import bid_cap

        cap = bid_cap(request=request)
        if cap is None:
            raise DomainError("no GPU in the catalog can serve this order, so there is no on-demand price to "
                              "cap a bid against", field="max_price_per_hour")
        cap = cap * order.gpu_count  # the bid is for all k GPUs together, as the engine compares it
        if order.max_price_per_hour > cap:
            raise DomainError(f"a bid above the on-demand price ({cap}/h) is refused: order on demand instead",
                              field="max_price_per_hour")
    allow_preemption = order.mode == Mode.ON_DEMAND and (order.preempt_until is None or order.preempt_until <= now)
    decision, slices = allocation.allocate(request=request, snapshot=snapshot_now,
                                           holds_for=capacity.holds_for_order(order=order, now=now),
                                           retries=market("PLACE_RETRIES"), allow_preemption=allow_preemption)
    if slices:
        _open_leases(order=order, slices=slices, now=now)
        return True
    order.reasons, order.explain = decision.reasons, decision.explain()[:500]
    if decision.ok and decision.preempt:
        order.explain = f"waiting for {len(decision.preempt)} spot lease(s) to leave"
        if order.if_unavailable == Order.IfUnavailable.QUEUE:
            from .spot import spot_interrupt

            deadline = now + timedelta(seconds=market("PREEMPT_NOTICE_SECONDS"))
            for lease_id in decision.preempt:
                spot_interrupt(lease_id=lease_id, kind="preempted", now=now, deadline=deadline)
            order.preempt_until = deadline
    order.save(update_fields=["attempts", "reasons", "explain", "preempt_until"])
    return False


def _slice_price(*, order: Order, sl) -> Decimal:
    gpu = sl.gpu
    geometry, node = gpu.geometry(), gpu.node
    profile = sl.profile or None
    if order.mode == Mode.SPOT:
        from .spot import spot_factor_for

        factor = spot_factor_for(model=gpu.gpu_model.key)
        return capacity.spot_price(node=node, geometry=geometry, profile=profile, factor=factor)
    return capacity.on_demand_price(node=node, geometry=geometry, profile=profile)


def _open_leases(*, order: Order, slices: list, now: datetime) -> None:
    """One lease per claimed slice (k GPUs: k leases), after one wallet check for all of them."""
    from .leases import lease_open

    prices = [_slice_price(order=order, sl=sl) for sl in slices]
    price = sum(prices, Decimal("0"))
    needed = capacity.cents(price * Decimal(str(market("MIN_PREPAID_SECONDS"))) / 3600)
    if ledger.wallet_balance(user=order.buyer) < needed:
        # Nothing of this attempt may stay: the slice claims are undone with the order's transaction.
        raise ledger.InsufficientFunds(
            f"Not enough money in the wallet: {needed} USD covers the first "
            f"{int(market('MIN_PREPAID_SECONDS') // 60)} minutes at {price}/h"
            + (f" for {len(slices)} GPUs" if len(slices) > 1 else "") + ".", details={"needed": str(needed)})
    # Provisional end while the instance is carved: the duration counts from running (leases.running_ends_at);
    # until then the lease holds its slots for the duration plus the provisioning allowance, as its holds did.
    ends_at = (now + timedelta(seconds=order.duration_seconds + capacity.provision_allowance())
               if order.duration_seconds else None)
    for sl, p in zip(slices, prices):
        lease_open(order=order, buyer=order.buyer, sl=sl, mode=order.mode, price_per_hour=p, ends_at=ends_at,
                   bid=order.max_price_per_hour if order.mode == Mode.SPOT else None, now=now)
    order.state, order.placed_at, order.price_per_hour = Order.State.PLACED, now, price
    order.reasons, order.explain = {}, ""
    order.save(update_fields=["state", "placed_at", "price_per_hour", "reasons", "explain", "attempts"])


def orders_retry(*, now: datetime | None = None) -> int:
    """Beat: try the queue again, highest priority first, then oldest first. Returns orders placed."""
    now = now or timezone.now()
    placed = 0
    ids = list(Order.objects.filter(state=Order.State.QUEUED).order_by("-priority", "created_at")
               .values_list("id", flat=True)[:market("QUEUE_BATCH")])
    for order_id in ids:
        try:
            with transaction.atomic():
                # Lock the order: the race is a second beat worker or the buyer cancelling it meanwhile.
                order = (Order.objects.select_for_update(skip_locked=True)
                         .filter(pk=order_id, state=Order.State.QUEUED).first())
                if order is None:
                    continue
                if order.mode == Mode.RESERVED and order.window_start <= now:
                    order.state, order.explain = Order.State.FAILED, "the window started before capacity was free"
                    order.save(update_fields=["state", "explain"])
                    continue
                placed += _try_place(order=order, now=now)
        except ledger.InsufficientFunds as exc:
            Order.objects.filter(pk=order_id, state=Order.State.QUEUED).update(
                state=Order.State.FAILED, explain=exc.message[:500])
    return placed


def order_cancel(*, buyer, order_id) -> Order:
    """Cancel a queued order, or end the lease of a placed on-demand or spot order. Paid reservations are
    not cancelled: their holder lists them for resale instead."""
    from .leases import lease_end

    with transaction.atomic():
        # Lock the order: the race is the queue placing it while the buyer cancels.
        order = Order.objects.select_for_update().filter(pk=order_id, buyer=buyer).first()
        if order is None:
            raise NotFound("no such order among yours", field="order")
        if order.state == Order.State.QUEUED:
            order.state = Order.State.CANCELLED
            order.save(update_fields=["state"])
            SpotBid.objects.filter(order=order).update(state=SpotBid.State.CLOSED)
        elif order.state == Order.State.PLACED and order.mode in (Mode.ON_DEMAND, Mode.SPOT):
            for lease_id in order.leases.filter(state__in=Lease.OPEN_STATES).values_list("id", flat=True):
                lease_end(lease_id=lease_id, buyer=buyer, reason="cancelled by the buyer")
        elif order.state == Order.State.PLACED:
            raise Conflict("a reservation is paid and held whether used or not; list it for resale instead",
                           code="not_cancellable")
        else:
            raise Conflict(f"the order is {order.state}", code="not_cancellable")
    return order
