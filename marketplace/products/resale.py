"""Resale: the holder of a reservation lists a future part of it at an ask of at most RESALE_CAP (0.9) × base ×
share per hour; a buyer purchases it; the window moves to the buyer atomically (the reservation is split),
the seller's wallet gets the price less the published platform fee (PLATFORM_FEE_RATE), each side's money
booked under its own project.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from marketplace.amounts import cost, spread, usd_per_hour
from marketplace.claims.windows import ListingClaim
from marketplace.conf import market
from marketplace.lifecycle.workloads import workload_create
from marketplace.models import Lease, Mode, Order, ResaleListing, Reservation
from marketplace.money import movements
from marketplace.pricing import resale_cap as cap_for
from scheduler.errors import Conflict, DomainError, NotFound
from scheduler.services.allocation import allocate


def resale_cap(*, reservation: Reservation) -> Decimal:
    """The highest ask for a window of the reservation's slice, per hour."""
    gpu = reservation.gpu
    return cap_for(base_per_gpu_hour=gpu.node.price_per_gpu_hour, geometry=gpu.geometry(),
                   profile=reservation.profile or None)


def listing_create(*, seller, reservation_id, starts_at: datetime, ends_at: datetime, ask_per_hour: Decimal,
                   now: datetime | None = None) -> ResaleListing:
    """List [starts_at, ends_at) of the seller's reservation for resale at `ask_per_hour`."""
    now = now or timezone.now()
    with transaction.atomic():
        # Lock the reservation: the race is a purchase splitting it while its holder lists another part.
        r = (Reservation.objects.select_for_update(of=("self",)).select_related("gpu__node", "gpu__gpu_model")
             .filter(pk=reservation_id, holder=seller).first())
        if r is None:
            raise NotFound("no such reservation among yours", field="reservation")
        if r.state not in Reservation.LIVE_STATES:
            raise Conflict(f"the reservation is {r.state}", code="not_listable")
        if starts_at < now:
            raise DomainError("a listed window cannot start in the past", field="starts_at")
        if ends_at <= starts_at:
            raise DomainError("the listed window must end after it starts", field="ends_at")
        if starts_at < r.starts_at or ends_at > r.ends_at:
            raise DomainError(f"the listed window must lie within the reservation "
                              f"({r.starts_at.isoformat()} to {r.ends_at.isoformat()})", field="starts_at")
        cap = resale_cap(reservation=r)
        if not (Decimal("0") < ask_per_hour <= cap):
            raise DomainError(f"The ask must be above $0 and at most {usd_per_hour(cap)} ({market('RESALE_CAP')} × "
                              f"the provider's base price of this slice).", field="ask_per_hour",
                              details={"cap": str(cap)})
        if r.listings.filter(state=ResaleListing.State.OPEN, starts_at__lt=ends_at, ends_at__gt=starts_at).exists():
            raise Conflict("an open listing already covers part of this window", code="listing_overlap")
        return ResaleListing.objects.create(
            reservation=r, seller=seller, starts_at=starts_at, ends_at=ends_at, ask_per_hour=ask_per_hour,
            price_total=cost(per_hour=ask_per_hour, seconds=(ends_at - starts_at).total_seconds()),
            gpu_model=r.gpu.gpu_model.key if r.gpu.gpu_model else "", profile=r.profile or "whole",
            region=r.gpu.node.region)


def listing_cancel(*, seller, listing_id) -> ResaleListing:
    with transaction.atomic():
        listing = ResaleListing.objects.select_for_update().filter(pk=listing_id, seller=seller).first()
        if listing is None:
            raise NotFound("no such listing among yours", field="listing")
        if listing.state != ResaleListing.State.OPEN:
            raise Conflict(f"the listing is {listing.state}", code="not_open")
        listing.state = ResaleListing.State.CANCELLED
        listing.save(update_fields=["state"])
    return listing


@dataclass
class Purchase:
    listing: ResaleListing
    reservation: Reservation  # the buyer's
    order: Order


def listing_purchase(*, buyer, listing_id, now: datetime | None = None, project=None,
                     workload: dict | None = None) -> Purchase:
    """Buy a listed window: paid from the buyer's wallet, the seller credited less the fee, the reservation
    split so that the window is the buyer's and no longer the seller's. A window sells once. `workload`: what
    runs in it (products.workloads.workload_resolve's)."""
    now = now or timezone.now()

    def write(r: Reservation, listing: ResaleListing) -> Purchase:
        if listing.state != ResaleListing.State.OPEN:
            raise Conflict(f"the listing is {listing.state}", code="not_open")
        if listing.seller_id == buyer.pk:
            raise DomainError("you cannot buy your own listing", field="listing")
        if listing.starts_at < now:
            raise Conflict("the listed window has already started", code="window_started")
        if r.state not in Reservation.LIVE_STATES or listing.starts_at < r.starts_at or listing.ends_at > r.ends_at:
            raise Conflict("the reservation no longer covers this window", code="not_open")
        node = r.gpu.node
        if workload is not None and not (node.runs_containers and node.allows_image(workload["image"])):
            raise Conflict(f"the window's node does not run {workload['image']}: its provider runs no containers "
                           f"there or does not allow that image", code="image_not_allowed")
        order = Order.objects.create(buyer=buyer, mode=Mode.RESALE, listing=listing, state=Order.State.PLACED,
                                     gpu_models=[listing.gpu_model], window_start=listing.starts_at,
                                     window_end=listing.ends_at, price_per_hour=listing.ask_per_hour,
                                     total_price=listing.price_total, placed_at=now, project=project)
        if workload is not None:
            workload_create(order=order, resolved=workload)
        seller_project = r.order.project_id if r.order_id else None
        _, fee = movements.resale_sale(buyer=buyer, seller=listing.seller_id, amount=listing.price_total,
                                       idempotency_key=f"resale:{listing.pk}", order=order.pk,
                                       buyer_project=project, seller_project=seller_project,
                                       memo=f"resale of {str(r.pk)[:8]} {listing.starts_at:%Y-%m-%d %H:%M}")
        mine = _split(r, listing=listing, buyer=buyer, order=order)
        listing.state, listing.buyer, listing.sold_reservation = ResaleListing.State.SOLD, buyer, mine
        listing.fee, listing.sold_at = fee, now
        listing.save(update_fields=["state", "buyer", "sold_reservation", "fee", "sold_at"])
        return Purchase(listing=listing, reservation=mine, order=order)

    _, purchase = allocate(claim=ListingClaim(listing_id=listing_id, write=write), retries=market("PLACE_RETRIES"))
    if purchase is None:
        raise Conflict("the listing is moving between pieces of its reservation; try again", code="busy")
    return purchase


def _split(r: Reservation, *, listing: ResaleListing, buyer, order: Order) -> Reservation:
    """Replace `r` by up to three pieces: the seller's before, the buyer's window, the seller's after."""
    r.state = Reservation.State.SPLIT  # first, so the pieces do not overlap a live reservation
    r.save(update_fields=["state"])
    # What the parent paid, shared over before / sold / after to the micro-dollar, adding up to exactly its
    # price: the pieces (and their refunds) are never worth more than was paid.
    spans = [(r.starts_at, listing.starts_at), (listing.starts_at, listing.ends_at), (listing.ends_at, r.ends_at)]
    before_total, _, after_total = spread(r.price_total, [(b - a).total_seconds() for a, b in spans])

    def piece(holder, start, end, state, total, per_hour=r.price_per_hour, order=r.order) -> Reservation:
        return Reservation.objects.create(
            holder=holder, order=order, parent=r, gpu_id=r.gpu_id, profile=r.profile, slot_start=r.slot_start,
            slot_end=r.slot_end, starts_at=start, ends_at=end, state=state, price_per_hour=per_hour,
            price_total=total)

    pieces = []
    if r.starts_at < listing.starts_at:
        pieces.append(piece(r.holder, r.starts_at, listing.starts_at, _live_state(r), before_total))
    mine = piece(buyer, listing.starts_at, listing.ends_at, Reservation.State.BOOKED, listing.price_total,
                 per_hour=listing.ask_per_hour, order=order)
    if listing.ends_at < r.ends_at:
        pieces.append(piece(r.holder, listing.ends_at, r.ends_at, Reservation.State.BOOKED, after_total))
    # The seller's running lease (if any) belongs to the piece that covers now; other listings follow theirs.
    before = pieces[0] if pieces and pieces[0].starts_at == r.starts_at else None
    if before is not None:
        Lease.objects.filter(reservation=r, state__in=Lease.OPEN_STATES).update(reservation=before,
                                                                               ends_at=before.ends_at)
    for other in r.listings.filter(state=ResaleListing.State.OPEN).exclude(pk=listing.pk):
        home = next((p for p in pieces if p.starts_at <= other.starts_at and other.ends_at <= p.ends_at), None)
        if home is not None:
            ResaleListing.objects.filter(pk=other.pk).update(reservation=home)
    return mine


def _live_state(r: Reservation) -> str:
    """The state the seller's first piece inherits: running if the original had a running lease."""
    running = Lease.objects.filter(reservation=r, state__in=Lease.OPEN_STATES).exists()
    return Reservation.State.ACTIVE if running else Reservation.State.BOOKED
