"""REST API of the market: catalog offers, spot price series, orders, leases, reservations, resale listings,
bids. Thin: parse, call one service or selector, shape. A buyer's querysets hold only its own rows, so
someone else's id is a 404. Writes take JSON only (anything else is a 415) and an API key's `trade` scope."""
from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from marketplace.api.workloads import (LOGS_SCHEMA, WorkloadCreateSerializer, WorkloadRunSerializer,
                                       WorkloadSerializer, logs_response, spec_of, workload_run_data)
from marketplace import metering, selectors
from marketplace.amounts import micro
from marketplace.lifecycle import leases as lease_services
from marketplace.lifecycle.reliability import lease_failure_report
from marketplace.models import Lease, LeaseFailureReport, Mode, Order, ResaleListing, Reservation, SpotBid, SpotPrice
from marketplace.products import (orders as order_services, reservations as reservation_services,
                                  resale as resale_services)
from marketplace.products.orders import ORDER_BOUNDS, OrderSpec

VERSION = r"^\d{1,3}(\.\d{1,3}){0,2}$"
MARKET_SCOPE = "trade"


def _bounds(name: str) -> dict:
    low, high = ORDER_BOUNDS[name]
    return {k: v for k, v in (("min_value", low), ("max_value", high)) if v is not None}


class OrderCreateSerializer(serializers.Serializer):
    """The order body; its bounds are products.orders.ORDER_BOUNDS, which the service enforces too."""

    mode = serializers.ChoiceField(choices=Mode.choices)
    gpu_models = serializers.ListField(child=serializers.CharField(max_length=40), required=False,
                                       max_length=ORDER_BOUNDS["gpu_models"][1])
    memory_gb = serializers.FloatField(required=False, default=0, **_bounds("memory_gb"))
    compute_slices = serializers.IntegerField(required=False, **_bounds("compute_slices"),
                                              help_text="compute slices of a MIG slice (default 1)")
    whole_gpu = serializers.BooleanField(required=False, help_text="a whole GPU (default: a slice, unless gpu_count > 1)")
    gpu_count = serializers.IntegerField(required=False, default=1, **_bounds("gpu_count"),
                                         help_text="k whole GPUs on one node (on demand, spot); needs whole_gpu")
    min_cuda = serializers.RegexField(VERSION, required=False, allow_blank=True)
    min_compute_capability = serializers.RegexField(VERSION, required=False, allow_blank=True)
    regions = serializers.ListField(child=serializers.CharField(max_length=40), required=False,
                                    max_length=ORDER_BOUNDS["regions"][1])
    buyer_region = serializers.CharField(max_length=40, required=False, default="", allow_blank=True)
    duration_seconds = serializers.IntegerField(required=False, allow_null=True, **_bounds("duration_seconds"))
    window_start = serializers.DateTimeField(required=False, allow_null=True)
    window_end = serializers.DateTimeField(required=False, allow_null=True)
    max_price_per_hour = serializers.DecimalField(max_digits=12, decimal_places=6, required=False, allow_null=True,
                                                  **_bounds("max_price_per_hour"))
    priority = serializers.IntegerField(required=False, default=0, **_bounds("priority"))
    if_unavailable = serializers.ChoiceField(choices=Order.IfUnavailable.choices, required=False, default="fail")
    webhook_url = serializers.URLField(max_length=300, required=False, allow_blank=True)
    listing = serializers.UUIDField(required=False, allow_null=True)
    project = serializers.IntegerField(required=False, allow_null=True, help_text="one of your projects")
    workload = WorkloadCreateSerializer(required=False, allow_null=True,
                                        help_text="the container each lease runs (none: the lease holds its slice "
                                                  "for your own use)")

    def spec(self, **fixed) -> OrderSpec:
        d = {**self.validated_data, **fixed}
        d["listing_id"] = d.pop("listing", None)
        d["project_id"] = d.pop("project", None)
        d["workload"] = spec_of(d["workload"]) if d.get("workload") is not None else None
        return OrderSpec(**d)


class BidCreateSerializer(OrderCreateSerializer):
    """A spot order: the order's fields without `mode`; `max_price_per_hour` is the bid."""

    mode = None
    max_price_per_hour = serializers.DecimalField(max_digits=12, decimal_places=6,
                                                  help_text="the bid: the most you pay per hour (at most the on-demand "
                                                            "price)", **_bounds("max_price_per_hour"))


class OrderFilterSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=Order.State.choices, required=False)
    mode = serializers.ChoiceField(choices=Mode.choices, required=False)


class LeaseFilterSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=Lease.State.choices, required=False)
    mode = serializers.ChoiceField(choices=Mode.choices, required=False)


class ListingFilterSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(max_length=40, required=False)
    region = serializers.CharField(max_length=40, required=False)
    profile = serializers.CharField(max_length=30, required=False)
    max_ask = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=0, required=False,
                                       help_text="the most per hour")
    starts_after = serializers.DateTimeField(required=False)


class SpotPriceFilterSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(max_length=40, required=False)
    since = serializers.DateTimeField(required=False)


class OrderSerializer(serializers.ModelSerializer):
    # A plain string: it is empty when the order has none (a URL field's schema would say "a URI").
    webhook_url = serializers.CharField(read_only=True, help_text="this order's notices go here (empty: the "
                                                                  "account's webhook)")
    leases = serializers.SerializerMethodField()
    reservations = serializers.SerializerMethodField()
    workload = WorkloadSerializer(read_only=True, allow_null=True, default=None)

    class Meta:
        model = Order
        fields = ["id", "mode", "state", "if_unavailable", "gpu_models", "memory_gb", "compute_slices", "whole_gpu",
                  "gpu_count", "min_cuda", "min_compute_capability", "regions", "duration_seconds", "window_start", "window_end",
                  "max_price_per_hour", "priority", "webhook_url", "listing", "project", "price_per_hour", "total_price",
                  "reasons", "explain", "attempts", "created_at", "placed_at", "leases", "reservations", "workload"]
        read_only_fields = fields

    def get_leases(self, o: Order) -> list[str]:
        return [str(lease.pk) for lease in o.leases.all()]

    def get_reservations(self, o: Order) -> list[str]:
        return [str(r.pk) for r in o.reservations.all()]


class ConnectionPortSerializer(serializers.Serializer):
    container_port = serializers.IntegerField()
    host_port = serializers.IntegerField()
    protocol = serializers.CharField()
    kind = serializers.CharField(help_text="ssh, http or tcp")
    url = serializers.CharField(required=False, help_text="http ports")


class ConnectionSerializer(serializers.Serializer):
    """How to use a running lease: its device, and with a container how to reach it."""

    node = serializers.UUIDField()
    hostname = serializers.CharField()
    region = serializers.CharField()
    gpu_uuid = serializers.CharField()
    device_uuid = serializers.CharField(help_text="the MIG device (or GPU) UUID: CUDA_VISIBLE_DEVICES")
    mig_profile = serializers.CharField(allow_null=True)
    env = serializers.DictField(child=serializers.CharField())
    address = serializers.CharField(required=False, help_text="with a container: where its ports are published")
    ssh = serializers.CharField(required=False, allow_null=True)
    urls = serializers.ListField(child=serializers.CharField(), required=False)
    ports = ConnectionPortSerializer(many=True, required=False)
    jupyter_token = serializers.CharField(required=False)


class InterruptionSerializer(serializers.Serializer):
    kind = serializers.CharField()
    announced_at = serializers.DateTimeField()
    deadline = serializers.DateTimeField()
    notice_seconds = serializers.FloatField()
    credited = serializers.CharField(help_text="what was credited for a short notice (USD)")


class LeaseSerializer(serializers.ModelSerializer):
    gpu_model = serializers.CharField(source="slice.gpu.gpu_model.key", default=None, allow_null=True)
    profile = serializers.SerializerMethodField()
    region = serializers.CharField(source="slice.gpu.node.region")
    connection = serializers.SerializerMethodField()
    interruption = serializers.SerializerMethodField()
    cost = serializers.SerializerMethodField(help_text="what it has cost so far, to the micro-dollar (charged or "
                                                       "not yet)")
    workload = serializers.SerializerMethodField(help_text="its container: state, exit code, error (null: none)")

    class Meta:
        model = Lease
        fields = ["id", "order", "reservation", "mode", "state", "gpu_model", "profile", "region", "price_per_hour",
                  "bid_per_hour", "started_at", "ends_at", "ended_at", "end_reason", "cost", "billed_until",
                  "cost_charged", "connection", "interruption", "workload", "created_at"]
        read_only_fields = fields

    def get_profile(self, lease: Lease) -> str:
        return lease.slice.profile or "whole"

    def get_cost(self, lease: Lease) -> str:
        return str(micro(metering.cost_at(lease, timezone.now())))

    @extend_schema_field(ConnectionSerializer(allow_null=True))
    def get_connection(self, lease: Lease) -> dict | None:
        return lease_services.connection_facts(lease)

    @extend_schema_field(WorkloadRunSerializer(allow_null=True))
    def get_workload(self, lease: Lease) -> dict | None:
        return workload_run_data(lease)

    @extend_schema_field(InterruptionSerializer(allow_null=True))
    def get_interruption(self, lease: Lease) -> dict | None:
        i = getattr(lease, "interruption", None)
        if i is None:
            return None
        return {"kind": i.kind, "announced_at": i.announced_at, "deadline": i.deadline,
                "notice_seconds": i.notice_seconds, "credited": str(i.credited)}


class FailureReportCreateSerializer(serializers.Serializer):
    reason = serializers.ChoiceField(choices=LeaseFailureReport.Reason.choices)
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class FailureReportSerializer(serializers.ModelSerializer):
    class Meta:
        model = LeaseFailureReport
        fields = ["lease", "reason", "note", "created_at"]
        read_only_fields = fields


class ReservationSerializer(serializers.ModelSerializer):
    gpu_model = serializers.CharField(source="gpu.gpu_model.key", default=None, allow_null=True)
    gpu = serializers.CharField(source="gpu.uuid")
    region = serializers.CharField(source="gpu.node.region")

    class Meta:
        model = Reservation
        fields = ["id", "order", "parent", "gpu", "gpu_model", "region", "profile", "slot_start", "slot_end",
                  "starts_at", "ends_at", "price_per_hour", "price_total", "state", "created_at"]
        read_only_fields = fields


class ReservationCancelledSerializer(serializers.Serializer):
    """What cancelling a reservation did: the reservation (state `cancelled`) and the refund by the cancel policy."""

    reservation = ReservationSerializer()
    refunded = serializers.DecimalField(max_digits=18, decimal_places=6,
                                        help_text="back to the wallet, to the micro-dollar")
    refunded_share = serializers.DecimalField(max_digits=4, decimal_places=3, help_text="of the price paid (0..1)")
    rule = serializers.CharField(help_text="the policy's rule that applied, in words")


class ListingCreateSerializer(serializers.Serializer):
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    ask_per_hour = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=0)


class ListingSerializer(serializers.ModelSerializer):
    class Meta:
        model = ResaleListing
        fields = ["id", "gpu_model", "profile", "region", "starts_at", "ends_at", "ask_per_hour", "price_total",
                  "state", "created_at", "sold_at"]
        read_only_fields = fields


class PurchaseSerializer(serializers.Serializer):
    listing = ListingSerializer()
    order = serializers.UUIDField(help_text="the resale order made for the purchase")
    reservation = ReservationSerializer(help_text="your new reservation: the window bought")


class BidSerializer(serializers.ModelSerializer):
    order = OrderSerializer(read_only=True)

    class Meta:
        model = SpotBid
        fields = ["id", "max_price_per_hour", "state", "order", "created_at"]
        read_only_fields = fields


class SpotPriceSerializer(serializers.ModelSerializer):
    class Meta:
        model = SpotPrice
        fields = ["gpu_model", "at", "factor", "free_share", "price_per_gpu_hour"]
        read_only_fields = fields


class OrderViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The caller's orders. POST places one (mode on_demand / reserved / spot / resale): 201 placed, 202 queued;
    cancel ends it."""

    serializer_class = OrderSerializer
    queryset = Order.objects.none()  # the schema's path types; requests use get_queryset
    filter_serializer = OrderFilterSerializer
    write_scope = MARKET_SCOPE
    error_statuses = {"create": (402, 404, 409), "cancel": (409,)}  # create: 404 for a listing or project not yours

    def get_queryset(self):
        return selectors.order_list(user=self.request.user)

    @extend_schema(request=OrderCreateSerializer, responses={201: OrderSerializer, 202: OrderSerializer})
    def create(self, request):
        data = OrderCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        order = order_services.order_place(buyer=request.user, spec=data.spec())
        body = OrderSerializer(self.get_queryset().get(pk=order.pk)).data
        return Response(body, status=status.HTTP_201_CREATED if order.state == Order.State.PLACED
                        else status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses=OrderSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        order = order_services.order_cancel(buyer=request.user, order_id=self.get_object().pk)
        return Response(OrderSerializer(self.get_queryset().get(pk=order.pk)).data)


class LeaseViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The caller's leases with their connection facts once running. POST end/ stops one."""

    serializer_class = LeaseSerializer
    queryset = Lease.objects.none()
    filter_serializer = LeaseFilterSerializer
    write_scope = MARKET_SCOPE
    error_statuses = {"end": (409,), "report_failure": (409,)}

    def get_queryset(self):
        return selectors.lease_list(user=self.request.user)

    @extend_schema(request=FailureReportCreateSerializer, responses={201: FailureReportSerializer},
                   description="Report that the lease failed on the provider's side (once per lease): it counts "
                               "against the node's and the GPU's reliability score (docs/operations.md). 409: "
                               "`already_reported`, `lease_not_started`.")
    @action(detail=True, methods=["post"], url_path="report-failure")
    def report_failure(self, request, pk=None):
        data = FailureReportCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        report = lease_failure_report(buyer=request.user, lease_id=self.get_object().pk, **data.validated_data)
        return Response(FailureReportSerializer(report).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=LeaseSerializer)
    @action(detail=True, methods=["post"])
    def end(self, request, pk=None):
        lease = lease_services.lease_end(lease_id=self.get_object().pk, buyer=request.user)
        return Response(LeaseSerializer(self.get_queryset().get(pk=lease.pk)).data)

    @LOGS_SCHEMA
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """The kept tail of its container's output (the last MARKET_WORKLOAD_LOG_TAIL_BYTES), as text."""
        return logs_response(self.get_object())


class ReservationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The caller's reservations. POST list-for-resale/ offers a future part of one."""

    serializer_class = ReservationSerializer
    queryset = Reservation.objects.none()
    write_scope = MARKET_SCOPE
    error_statuses = {"list_for_resale": (409,), "cancel": (409,)}

    def get_queryset(self):
        return selectors.reservation_list(user=self.request.user)

    @extend_schema(
        request=None, responses={200: ReservationCancelledSerializer},
        description="Cancel a booked window by the cancel policy (docs/market.md): the whole price back until "
                    "MARKET_RESERVATION_FREE_CANCEL_SECONDS (a day) before its start or within "
                    "MARKET_RESERVATION_CANCEL_GRACE_SECONDS (10 minutes) of booking, MARKET_RESERVATION_LATE_CANCEL_"
                    "REFUND (half) of it later; never once it has started. Its open listings are withdrawn. No body. "
                    "409: `window_started` (list the rest for resale), `bought_on_resale`, `not_cancellable` (over, "
                    "refunded or cancelled).")
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        r, terms = reservation_services.reservation_cancel(holder=request.user, reservation_id=self.get_object().pk)
        return Response(ReservationCancelledSerializer({
            "reservation": self.get_queryset().get(pk=r.pk), "refunded": terms.refund, "refunded_share": terms.share,
            "rule": terms.why}).data)

    @extend_schema(request=ListingCreateSerializer, responses={201: ListingSerializer})
    @action(detail=True, methods=["post"], url_path="list-for-resale")
    def list_for_resale(self, request, pk=None):
        data = ListingCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        listing = resale_services.listing_create(seller=request.user, reservation_id=self.get_object().pk,
                                                 **data.validated_data)
        return Response(ListingSerializer(listing).data, status=status.HTTP_201_CREATED)


class ResaleListingViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Open resale listings (public), filtered by gpu_model, region, profile, max_ask, starts_after.
    POST buy/ purchases one; POST withdraw/ takes one's own listing back."""

    serializer_class = ListingSerializer
    queryset = ResaleListing.objects.none()
    filter_serializer = ListingFilterSerializer
    write_scope = MARKET_SCOPE
    error_statuses = {"buy": (402, 409), "withdraw": (409,)}

    def get_permissions(self):
        return [AllowAny()] if self.action in ("list", "retrieve") else super().get_permissions()

    def get_queryset(self):
        return selectors.listing_list(include_closed=self.action != "list")

    def filtered(self, queryset, values: dict):
        return selectors.listing_list(**values)

    @extend_schema(request=None, responses={201: PurchaseSerializer})
    @action(detail=True, methods=["post"])
    def buy(self, request, pk=None):
        purchase = resale_services.listing_purchase(buyer=request.user, listing_id=self.get_object().pk)
        return Response(PurchaseSerializer({"listing": purchase.listing, "order": purchase.order.pk,
                                            "reservation": purchase.reservation}).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=ListingSerializer)
    @action(detail=True, methods=["post"])
    def withdraw(self, request, pk=None):
        listing = resale_services.listing_cancel(seller=request.user, listing_id=self.get_object().pk)
        return Response(ListingSerializer(listing).data)


class BidViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The caller's spot bids. POST places a spot order (the order's fields; max_price_per_hour is the bid)."""

    serializer_class = BidSerializer
    queryset = SpotBid.objects.none()
    write_scope = MARKET_SCOPE
    error_statuses = {"create": (402, 404, 409), "cancel": (409,)}

    def get_queryset(self):
        return selectors.bid_list(user=self.request.user)

    @extend_schema(request=BidCreateSerializer, responses={201: BidSerializer})
    def create(self, request):
        data = BidCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        order = order_services.order_place(buyer=request.user, spec=data.spec(mode=Mode.SPOT))
        return Response(BidSerializer(self.get_queryset().get(order=order)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=BidSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        bid = self.get_object()
        order_services.order_cancel(buyer=request.user, order_id=bid.order_id)
        return Response(BidSerializer(self.get_queryset().get(pk=bid.pk)).data)


class SpotPriceViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Spot price history, newest first: ?gpu_model=h100-80gb&since=ISO-8601."""

    serializer_class = SpotPriceSerializer
    queryset = SpotPrice.objects.none()
    filter_serializer = SpotPriceFilterSerializer
    permission_classes = [AllowAny]

    def get_queryset(self):
        return selectors.spot_price_series()

    def filtered(self, queryset, values: dict):
        return selectors.spot_price_series(**values)
