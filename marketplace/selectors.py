"""Read side of the market: each buyer sees only its own orders, leases, reservations and bids; resale
listings and spot prices are public. Querysets load what their serializers show (no N+1)."""
from __future__ import annotations

from datetime import datetime

from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from marketplace.models import Lease, Order, ResaleListing, Reservation, SpotBid, SpotPrice


def order_list(*, user) -> QuerySet[Order]:
    return Order.objects.filter(buyer=user).select_related("workload__template").prefetch_related(
        Prefetch("leases", queryset=Lease.objects.only("id", "order_id")),
        Prefetch("reservations", queryset=Reservation.objects.only("id", "order_id")))


def lease_list(*, user) -> QuerySet[Lease]:
    return (Lease.objects.filter(buyer=user)
            .select_related("slice__gpu__node", "slice__gpu__gpu_model", "interruption", "run", "order__workload")
            .prefetch_related("run__ports"))


def reservation_list(*, user) -> QuerySet[Reservation]:
    # The piece paid for (the cancel policy's question) is the reservation or its parent, bought on resale or not.
    return (Reservation.objects.filter(holder=user)
            .select_related("gpu__node", "gpu__gpu_model", "bought_from", "parent__bought_from")
            .exclude(state=Reservation.State.SPLIT))


def bid_list(*, user) -> QuerySet[SpotBid]:
    return SpotBid.objects.filter(buyer=user).select_related("order__workload__template").prefetch_related(
        Prefetch("order__leases", queryset=Lease.objects.only("id", "order_id")),
        Prefetch("order__reservations", queryset=Reservation.objects.only("id", "order_id")))


def listing_list(*, gpu_model: str | None = None, region: str | None = None, profile: str | None = None,
                 max_ask=None, starts_after: datetime | None = None, include_closed: bool = False
                 ) -> QuerySet[ResaleListing]:
    qs = ResaleListing.objects.all()
    if not include_closed:
        qs = qs.filter(state=ResaleListing.State.OPEN, starts_at__gte=timezone.now())
    if gpu_model:
        qs = qs.filter(gpu_model=gpu_model)
    if region:
        qs = qs.filter(region=region)
    if profile:
        qs = qs.filter(profile=profile)
    if max_ask is not None:
        qs = qs.filter(ask_per_hour__lte=max_ask)
    if starts_after is not None:
        qs = qs.filter(starts_at__gte=starts_after)
    return qs.order_by("ask_per_hour", "starts_at")


def spot_price_series(*, gpu_model: str | None = None, since: datetime | None = None) -> QuerySet[SpotPrice]:
    qs = SpotPrice.objects.all()
    if gpu_model:
        qs = qs.filter(gpu_model=gpu_model)
    if since:
        qs = qs.filter(at__gte=since)
    return qs.order_by("gpu_model", "-at")
