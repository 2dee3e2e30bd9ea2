"""Orders: validated, priced, checked against the wallet, handed to the scheduler, and turned into leases (on
demand, spot), a reservation (reserved) or a bought window (resale). An order that cannot be placed now waits
in the queue with the engine's reasons, or is refused at once, as the buyer chose; the beat retries the queue
by priority, then first come first served. `order_quote` is what the same order would be given now (the
console's live preview): the engine's decision on a shared snapshot, priced by the one price function.

`ORDER_BOUNDS` are the order's limits, defined once: the API's serializer and the console's form take their
field bounds from it, and `_check` enforces it for every caller.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marketplace.amounts import cost, usd, usd_per_hour
from marketplace.claims import snapshot
from marketplace.claims.holds import holds_for, order_span, request_for
from marketplace.claims.refusals import refusal
from marketplace.claims.windows import SlicesClaim
from marketplace.conf import market
from marketplace.lifecycle import budgets
from marketplace.lifecycle.leases import lease_end, lease_interrupt, lease_open
from marketplace.lifecycle.workloads import workload_create
from marketplace.models import Lease, Mode, Order, Project, ReclaimPolicy, ResaleListing, Reservation, SpotBid
from marketplace.money import ledger
from marketplace.notifications import webhook_url_check
from marketplace.pricing import price_for, reserved_mode, spot_factor_for
from nodeagent.hardware.gpus import GPU_MODELS, name_of
from scheduler.core import perf
from scheduler.core.model import Decision
from scheduler.errors import Conflict, DomainError, NotFound
from scheduler.models import GpuModel
from scheduler.services.allocation import Snapshot, allocate, decide
from scheduler.services.transactions import retry_transient

from . import reservations, resale, spot
from .workloads import WorkloadSpec, workload_resolve

# The order's limits, once: (minimum, maximum); the duration's maximum is MARKET_MAX_DURATION_SECONDS.
ORDER_BOUNDS = {
    "memory_gb": (0, 1000),
    "compute_slices": (1, 8),
    "gpu_count": (1, 8),
    "priority": (-100, 100),
    "max_price_per_hour": (Decimal("0"), Decimal("100000")),
    "duration_seconds": (1, None),
    "gpu_models": (0, 20),  # how many may be named
    "regions": (0, 20),
}


def max_duration_seconds() -> int:
    return int(market("MAX_DURATION_SECONDS"))


@dataclass
class OrderSpec:
    """What a buyer asks for (the API's serializer and the console's form fill it; `_check` enforces it)."""

    mode: str
    gpu_models: list[str] | tuple = ()
    memory_gb: float = 0
    compute_slices: int | None = None  # None: not asked (1 for a slice)
    whole_gpu: bool | None = None  # None: not said (a slice, unless gpu_count > 1)
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
    workload: WorkloadSpec | None = None  # None: the lease only holds its slice


def _within(spec: OrderSpec, name: str, value) -> None:
    low, high = ORDER_BOUNDS[name]
    if isinstance(value, bool) or (low is not None and value < low) or (high is not None and value > high):
        raise DomainError(f"{name} is between {low} and {high}", field=name)


def _check(spec: OrderSpec, now: datetime) -> None:
    if spec.mode not in Mode.values:
        raise DomainError(f"mode is one of {', '.join(Mode.values)}", field="mode")
    if spec.if_unavailable not in Order.IfUnavailable.values:
        raise DomainError("if_unavailable is 'queue' or 'fail'", field="if_unavailable")
    for name in ("gpu_models", "regions"):
        if len(getattr(spec, name)) > ORDER_BOUNDS[name][1]:
            raise DomainError(f"name at most {ORDER_BOUNDS[name][1]} {name}", field=name)
    if spec.gpu_models:
        known = set(GpuModel.objects.filter(key__in=list(spec.gpu_models)).values_list("key", flat=True))
        unknown = sorted(set(spec.gpu_models) - known)
        if unknown:
            raise DomainError(f"unknown GPU model {unknown[0]!r}", field="gpu_models")
    for name in ("memory_gb", "priority"):
        _within(spec, name, getattr(spec, name))
    if spec.compute_slices is not None:
        _within(spec, "compute_slices", spec.compute_slices)
    if not isinstance(spec.gpu_count, int) or isinstance(spec.gpu_count, bool):
        raise DomainError("gpu_count is a whole number", field="gpu_count")
    _within(spec, "gpu_count", spec.gpu_count)
    if spec.gpu_count > 1:
        if spec.mode in (Mode.RESERVED, Mode.RESALE):
            raise DomainError(f"a {Mode(spec.mode).label} order is one GPU or slice: gpu_count must be 1",
                              field="gpu_count")
        if spec.compute_slices is not None or spec.whole_gpu is False:
            # A slice request with a count would silently become k whole GPUs at many times the slice's price.
            raise DomainError("gpu_count > 1 rents k whole GPUs on one node: leave compute_slices out (a MIG slice "
                              "order is one slice) and whole_gpu out or true", field="gpu_count")
    if spec.duration_seconds is not None and not (0 < spec.duration_seconds <= max_duration_seconds()):
        raise DomainError(f"duration_seconds is between 1 and {max_duration_seconds()}", field="duration_seconds")
    if spec.max_price_per_hour is not None:
        low, high = ORDER_BOUNDS["max_price_per_hour"]
        try:
            ok = spec.max_price_per_hour.is_finite() and low <= spec.max_price_per_hour <= high
        except (AttributeError, InvalidOperation):
            ok = False
        if not ok:
            raise DomainError(f"max_price_per_hour is between {low} and {high}", field="max_price_per_hour")
    if spec.mode == Mode.RESERVED:
        if spec.window_start is None or spec.window_end is None:
            raise DomainError("a reservation needs window_start and window_end", field="window_start")
        if spec.window_start < now - timedelta(seconds=60):
            raise DomainError("the window starts in the past", field="window_start")
        if spec.window_end <= spec.window_start:
            raise DomainError("the window must end after it starts", field="window_end")
        if (spec.window_end - spec.window_start).total_seconds() > max_duration_seconds():
            raise DomainError("the window is too long", field="window_end")
    elif spec.window_start or spec.window_end:
        raise DomainError("only reserved orders take a window", field="window_start")
    if spec.webhook_url:
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


def _order(*, buyer, spec: OrderSpec, project: Project | None) -> Order:
    """The Order row `spec` describes (unsaved)."""
    return Order(buyer=buyer, mode=spec.mode, if_unavailable=spec.if_unavailable, gpu_models=list(spec.gpu_models),
                 memory_gb=spec.memory_gb, compute_slices=spec.compute_slices or 1,
                 whole_gpu=bool(spec.whole_gpu) or spec.gpu_count > 1, gpu_count=spec.gpu_count,
                 min_cuda=spec.min_cuda, min_compute_capability=spec.min_compute_capability,
                 regions=list(spec.regions), buyer_region=spec.buyer_region, duration_seconds=spec.duration_seconds,
                 window_start=spec.window_start, window_end=spec.window_end,
                 max_price_per_hour=spec.max_price_per_hour, priority=spec.priority, webhook_url=spec.webhook_url,
                 project=project)


def order_place(*, buyer, spec: OrderSpec, now: datetime | None = None) -> Order:
    """Validate, price and place an order (or queue it, or refuse it with the engine's reasons)."""
    now = now or timezone.now()
    _check(spec, now)
    project = _project(buyer=buyer, project_id=spec.project_id)
    workload = workload_resolve(spec.workload) if spec.workload is not None else None
    # One transaction, run again whole if PostgreSQL aborts it to undo a deadlock (orders, agents' replies and
    # metering lock GPUs, nodes and wallets): the buyer gets the placement, not a 503.
    if spec.mode == Mode.RESALE:
        return retry_transient(lambda: _buy_listing(buyer=buyer, spec=spec, project=project, workload=workload,
                                                    now=now))
    return retry_transient(lambda: _place_new(buyer=buyer, spec=spec, project=project, workload=workload, now=now))


def _buy_listing(*, buyer, spec: OrderSpec, project, workload, now: datetime) -> Order:
    with transaction.atomic():
        cap = budgets.cap_lock(project_id=project.pk if project else None, now=now)
        order = resale.listing_purchase(buyer=buyer, listing_id=spec.listing_id, now=now, project=project,
                                        workload=workload).order
        budgets.cap_check(before=cap, now=now)
    return order


def _place_new(*, buyer, spec: OrderSpec, project, workload, now: datetime) -> Order:
    with transaction.atomic():
        order = _order(buyer=buyer, spec=spec, project=project)
        order.save()
        if workload is not None:
            workload_create(order=order, resolved=workload)
        if spec.mode == Mode.SPOT:
            SpotBid.objects.create(buyer=buyer, order=order, max_price_per_hour=spec.max_price_per_hour)
            _check_bid(order)
        placed = _try_place(order=order, now=now)
        if not placed and order.if_unavailable == Order.IfUnavailable.FAIL:
            raise Conflict(order.explain, code="unavailable",
                           details={"reasons": order.reasons, "explain": order.explain})
    return order


def _check_bid(order: Order) -> None:
    cap = spot.bid_cap(request=request_for(order))
    if cap is None:
        raise DomainError("no GPU in the catalog can serve this order, so there is no on-demand price to cap a "
                          "bid against", field="max_price_per_hour")
    cap = cap * order.gpu_count  # the bid is for all k GPUs together, as the engine compares it
    if order.max_price_per_hour > cap:
        raise DomainError(f"A bid above the on-demand price ({usd_per_hour(cap)}) is refused: order on demand "
                          f"instead.", field="max_price_per_hour", details={"cap": str(cap)})


def _try_place(*, order: Order, now: datetime, base: snapshot.MarketSnapshot | None = None) -> bool:
    """One placement attempt for `order` (locked or just created); `base` is a batch's snapshot. True when
    placed."""
    order.attempts += 1
    # A hard-capped project's budget, for every mode (resale: order_place): its row locked before the claim, read
    # again after it in the same transaction (lifecycle/budgets.py).
    cap = budgets.cap_lock(project_id=order.project_id, now=now)
    if order.mode == Mode.RESERVED:
        placed = reservations.reservation_book(order=order, now=now, base=base)
        if not placed:
            order.save(update_fields=["attempts", "reasons", "explain"])
        else:
            budgets.cap_check(before=cap, now=now)
        return placed
    allow_preemption = order.mode == Mode.ON_DEMAND and (order.preempt_until is None or order.preempt_until <= now)
    start, end = order_span(order, now=now)
    claim = SlicesClaim(request=request_for(order, now=now), start=start, end=end, base=base,
                        holds_for=holds_for(start=start, end=end), allow_preemption=allow_preemption)
    decision, slices = allocate(claim=claim, retries=market("PLACE_RETRIES"))
    if slices:
        _open_leases(order=order, slices=slices, now=now)
        budgets.cap_check(before=cap, now=now)
        return True
    order.reasons, order.explain = decision.reasons, refusal(request=claim.request, reasons=decision.reasons)[:500]
    if decision.ok and decision.preempt:
        order.explain = f"waiting for {len(decision.preempt)} spot lease(s) to leave"
        if order.if_unavailable == Order.IfUnavailable.QUEUE:
            deadline = now + timedelta(seconds=market("PREEMPT_NOTICE_SECONDS"))
            for lease_id in decision.preempt:
                lease_interrupt(lease_id=lease_id, kind="preempted", now=now, deadline=deadline)
            order.preempt_until = deadline
    order.save(update_fields=["attempts", "reasons", "explain", "preempt_until"])
    return False


def _slice_price(*, order: Order, base: Decimal, model: str, geometry, profile: str | None, now: datetime,
                 factors: dict | None = None) -> Decimal:
    mode = order.mode if order.mode != Mode.RESERVED else reserved_mode(starts_at=order.window_start, now=now)
    factor = spot_factor_for(model=model, known=factors) if order.mode == Mode.SPOT else None
    return price_for(mode=mode, base_per_gpu_hour=base, geometry=geometry, profile=profile, spot_factor=factor)


def _open_leases(*, order: Order, slices: list, now: datetime) -> None:
    """One lease per claimed slice (k GPUs: k leases), after one wallet check for all of them."""
    prices = [_slice_price(order=order, base=sl.gpu.node.price_per_gpu_hour, model=sl.gpu.gpu_model.key,
                           geometry=sl.gpu.geometry(), profile=sl.profile or None, now=now) for sl in slices]
    price = sum(prices, Decimal("0"))
    needed = cost(per_hour=price, seconds=market("MIN_PREPAID_SECONDS"))
    if ledger.wallet_balance(user=order.buyer) < needed:
        # Nothing of this attempt may stay: the slice claims are undone with the order's transaction.
        raise ledger.InsufficientFunds(
            f"Not enough money in the wallet: {usd(needed)} covers the first "
            f"{int(market('MIN_PREPAID_SECONDS') // 60)} minutes at {usd_per_hour(price)}"
            + (f" for {len(slices)} GPUs" if len(slices) > 1 else "") + ".", details={"needed": str(needed)})
    # Provisional end while the instance is carved: the duration counts from running (lifecycle's
    # running_ends_at); until then the lease holds its slots for the duration plus the provisioning
    # allowance, as its holds did.
    ends_at = order_span(order, now=now)[1] if order.duration_seconds else None
    for sl, p in zip(slices, prices):
        lease_open(order=order, buyer=order.buyer, sl=sl, mode=order.mode, price_per_hour=p, ends_at=ends_at,
                   bid=order.max_price_per_hour if order.mode == Mode.SPOT else None, now=now)
    order.state, order.placed_at, order.price_per_hour = Order.State.PLACED, now, price
    order.reasons, order.explain = {}, ""
    order.save(update_fields=["state", "placed_at", "price_per_hour", "reasons", "explain", "attempts"])


def _held_by_reclaim(now: datetime) -> Q:
    """Queued job orders an idle reclaim policy holds during its hours (docs/operations.md): their project's policy,
    or the buyer's default for an order whose project has none. The beat keeps `holding_until` (operations.reclaim),
    so no time zone is read here."""
    holding = ReclaimPolicy.objects.filter(enabled=True, hold_jobs=True, holding_until__gt=now)
    own = ReclaimPolicy.objects.filter(project__isnull=False).values("project_id")
    by_project = Q(project_id__in=holding.filter(project__isnull=False).values("project_id"))
    by_default = Q(buyer_id__in=holding.filter(project__isnull=True).values("user_id")) & (
        Q(project__isnull=True) | ~Q(project_id__in=own))
    return Q(workload__kind="job") & (by_project | by_default)


def orders_retry(*, now: datetime | None = None) -> int:
    """Beat: try the queue again, highest priority first, then oldest first, on one snapshot for the batch
    (built again after each placement). Returns orders placed."""
    now = now or timezone.now()
    placed = 0
    ids = list(Order.objects.filter(state=Order.State.QUEUED).exclude(_held_by_reclaim(now))
               .order_by("-priority", "created_at").values_list("id", flat=True)[:market("QUEUE_BATCH")])
    base = snapshot.fresh() if ids else None
    for order_id in ids:
        try:
            # Its own transaction per order, run again whole when PostgreSQL aborts it to undo a deadlock (its
            # GPU rows against a buyer's or a provider's transaction): one order's deadlock ends neither the pass
            # nor that order's turn in it.
            if retry_transient(lambda order_id=order_id, base=base: _retry_one(order_id, now=now, base=base)):
                placed += 1
                base = snapshot.fresh()
        except (ledger.InsufficientFunds, budgets.OverBudget) as exc:
            Order.objects.filter(pk=order_id, state=Order.State.QUEUED).update(
                state=Order.State.FAILED, explain=exc.message[:500])
            base = snapshot.fresh()
    return placed


def _retry_one(order_id, *, now: datetime, base: snapshot.MarketSnapshot | None) -> bool:
    """One queued order's turn in the pass, in its own transaction: True when it was placed."""
    with transaction.atomic():
        # Lock the order: the race is a second beat worker or the buyer cancelling it meanwhile.
        order = Order.objects.select_for_update(skip_locked=True).filter(pk=order_id, state=Order.State.QUEUED).first()
        if order is None:
            return False
        if order.mode == Mode.RESERVED and order.window_start <= now:
            order.state, order.explain = Order.State.FAILED, "the window started before capacity was free"
            order.save(update_fields=["state", "explain"])
            return False
        return _try_place(order=order, now=now, base=base)


def order_cancel(*, buyer, order_id) -> Order:
    """Cancel a queued order, end the leases of a placed on-demand or spot order, or cancel the booked windows of a
    reserved order by the cancel policy (reservations.reservation_cancel; a started one is resold instead). A window
    bought on the resale market is not cancelled: it is listed again."""
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
        elif order.state == Order.State.PLACED and order.mode == Mode.RESERVED:
            for r_id in order.reservations.filter(holder=buyer, state__in=Reservation.LIVE_STATES).values_list(
                    "id", flat=True):
                reservations.reservation_cancel(holder=buyer, reservation_id=r_id)
            order.refresh_from_db(fields=["state"])
        elif order.state == Order.State.PLACED:
            raise Conflict("A window bought on the resale market is not cancelled (its seller has been paid): list it "
                           "for resale instead.", code="not_cancellable")
        else:
            raise Conflict(f"the order is {order.state}", code="not_cancellable")
    return order


# --- what it would cost: the live preview ----------------------------------------------------------------------

@dataclass
class Quote:
    """What an order would be given now: the unit the engine picks and its price (or why nothing fits)."""

    mode: str
    available: bool = False
    explain: str = ""
    gpu_model: str = ""
    profile: str = ""
    region: str = ""
    per_hour: Decimal | None = None
    hours: Decimal | None = None
    total: Decimal | None = None
    pu: float | None = None
    per_pu_hour: Decimal | None = None
    short_notice: bool = False
    bid_too_low: bool = False
    first_charge: Decimal | None = None
    gpus: int = 1
    extra: dict = field(default_factory=dict)

    @property
    def unit(self) -> str:
        return f"{name_of(self.gpu_model)} {self.profile}"

    @property
    def none(self) -> bool:
        return not self.available and self.per_hour is None


def order_quote(*, buyer, spec: OrderSpec, now: datetime | None = None) -> Quote:
    """What `spec` would be given now, without placing it: the engine's decision on the shared snapshot (a
    second old at most) and the price of that placement. Bounds are checked as for an order (DomainError)."""
    now = now or timezone.now()
    if spec.mode == Mode.RESALE:
        listing = ResaleListing.objects.filter(pk=spec.listing_id).first() if spec.listing_id else None
        if listing is None:
            return Quote(mode=spec.mode, explain="Choose a listing to see its price.")
        hours = Decimal(str((listing.ends_at - listing.starts_at).total_seconds() / 3600))
        return Quote(mode=spec.mode, available=listing.state == ResaleListing.State.OPEN,
                     gpu_model=listing.gpu_model, profile=listing.profile, region=listing.region,
                     per_hour=listing.ask_per_hour, hours=hours, total=listing.price_total)
    _check(spec, now)
    image = workload_resolve(spec.workload)["image"] if spec.workload is not None else None
    order = _order(buyer=buyer, spec=spec, project=None)
    start, end = order_span(order, now=now)
    request = request_for(order, now=now, image=image)
    # A cap is what the buyer pays at most, not a reason to show no price: the preview decides without it.
    request.max_price_per_hour = None
    ms = snapshot.cached()
    window_start = order.window_start if order.mode == Mode.RESERVED else None
    with snapshot.view(ms, start=start, end=end, window_start=window_start) as snap:
        decision = decide(snapshot=snap, request=request, allow_preemption=False)
        return _priced(order, decision, snap, request=request, now=now, factors=ms.pool.spot_factors)


def _priced(order: Order, decision: Decision, snap: Snapshot, *, request, now: datetime, factors: dict) -> Quote:
    q = Quote(mode=order.mode, short_notice=order.mode == Mode.RESERVED and
              reserved_mode(starts_at=order.window_start, now=now) == "reserved_short_notice")
    if not decision.ok:
        q.explain = refusal(request=request, reasons=decision.reasons)
        return q
    q.available, q.gpus = True, len(decision.placements)
    per_hour, pu = Decimal("0"), 0.0
    for p in decision.placements:
        gpu, node, geometry = snap.facts(p.gpu_uuid)
        spec = GPU_MODELS[gpu.model]
        profile = p.profile if geometry is not None else None
        per_hour += _slice_price(order=order, base=node.price_per_gpu_hour, model=gpu.model, geometry=geometry,
                                 profile=profile, now=now, factors=factors)
        pu += perf.profile_pu(spec, geometry.profile(profile)) if profile else perf.gpu_pu(spec)
        q.gpu_model, q.region = gpu.model, node.region
        q.profile = profile or (geometry.full_profile.name if geometry is not None else "whole")
    q.per_hour, q.pu = per_hour, pu
    q.per_pu_hour = (per_hour / Decimal(str(pu))).quantize(Decimal("0.0001")) if pu else None
    if order.mode == Mode.RESERVED:
        q.hours = Decimal(str((order.window_end - order.window_start).total_seconds() / 3600))
    elif order.duration_seconds:
        q.hours = Decimal(order.duration_seconds) / 3600
    q.total = cost(per_hour=per_hour, seconds=q.hours * 3600) if q.hours else None
    q.bid_too_low = order.mode == Mode.SPOT and order.max_price_per_hour is not None and \
        order.max_price_per_hour < per_hour
    q.first_charge = cost(per_hour=per_hour, seconds=market("MIN_PREPAID_SECONDS"))
    return q
