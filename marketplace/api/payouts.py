"""REST API of a provider's money: earnings of a month (per lease or reserved window, per node, in total) and
payouts (what is payable, requests, their history). Thin: parse, call one service or selector, shape. Payouts are
for providers (a provider profile); what they list starts from request.user, so someone else's id is a 404."""
from __future__ import annotations

from decimal import Decimal

from drf_spectacular.utils import extend_schema, extend_schema_serializer, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from marketplace.api.filtering import query_values
from marketplace.api.money import MonthField
from marketplace.models import Payout
from marketplace.money import earnings
from marketplace.products import payouts

MONEY = {"max_digits": 18, "decimal_places": 6, "coerce_to_string": True}


# --- earnings ---------------------------------------------------------------------------------------------------

class NodeRefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()


class AmountsSerializer(serializers.Serializer):
    gross = serializers.DecimalField(**MONEY, help_text="what buyers paid (net + fee)")
    fee = serializers.DecimalField(**MONEY, help_text="the platform fee")
    net = serializers.DecimalField(**MONEY, help_text="what you earned")
    net_usd = serializers.DecimalField(max_digits=14, decimal_places=2, coerce_to_string=True)


class EarningItemSerializer(AmountsSerializer):
    kind = serializers.ChoiceField(choices=["lease", "reservation", "other"],
                                   help_text="a metered lease, a reserved window (paid when booked), or neither")
    lease = serializers.UUIDField(allow_null=True)
    reservation = serializers.UUIDField(allow_null=True)
    mode = serializers.CharField(help_text="on_demand, spot or reserved")
    node = NodeRefSerializer(allow_null=True)
    gpu_model = serializers.CharField()
    profile = serializers.CharField(help_text='MIG profile, or "whole"')
    period_start = serializers.DateTimeField(allow_null=True)
    period_end = serializers.DateTimeField(allow_null=True, help_text="null while the lease runs")
    gpu_seconds = serializers.IntegerField(help_text="metered seconds in the month; a window's length")


class EarningNodeSerializer(AmountsSerializer):
    node = NodeRefSerializer(allow_null=True)
    gpu_model = serializers.CharField()
    gpu_seconds = serializers.IntegerField()


class EarningTotalsSerializer(AmountsSerializer):
    gpu_seconds = serializers.IntegerField()


@extend_schema_serializer(many=False)
class EarningsSerializer(serializers.Serializer):
    month = serializers.CharField()
    currency = serializers.CharField()
    period_start = serializers.DateTimeField()
    period_end = serializers.DateTimeField()
    leases = EarningItemSerializer(many=True, help_text="per lease or reserved window, newest first")
    nodes = EarningNodeSerializer(many=True, help_text="per node and GPU model: the lease rows added up")
    totals = EarningTotalsSerializer(help_text="the month: the node rows added up")
    ledger = serializers.DictField(child=serializers.DecimalField(**MONEY),
                                   help_text="the month's earnings ledger per transaction kind, payouts included")
    balance = serializers.DecimalField(**MONEY, help_text="in your earnings account now")


class EarningsQuerySerializer(serializers.Serializer):
    month = MonthField(help_text="YYYY-MM (UTC; default: this month)")


class EarningsViewSet(viewsets.ViewSet):
    """GET ?month=YYYY-MM: a provider's earnings of the month per lease or reserved window, per node and GPU model,
    and in total (they add up exactly); never a buyer's order or project."""

    @extend_schema(operation_id="earnings_retrieve", parameters=[EarningsQuerySerializer],
                   responses={200: EarningsSerializer})
    def list(self, request):
        q = query_values(EarningsQuerySerializer, request)
        body = earnings.earnings(user=request.user, month=q.get("month"))
        return Response(EarningsSerializer(body).data)


# --- payouts ----------------------------------------------------------------------------------------------------

class PayoutSerializer(serializers.ModelSerializer):
    class Meta:
        model = Payout
        fields = ["id", "amount", "currency", "state", "requested_at", "decided_at", "note", "paid_at", "failed_at",
                  "failure_reason", "transfer_id", "simulated", "reversed_amount"]
        read_only_fields = fields


class PayoutRequestSerializer(serializers.Serializer):
    amount = serializers.DecimalField(max_digits=12, decimal_places=2, min_value=Decimal("0.01"),
                                      help_text="USD in whole cents, at least the minimum, at most what is payable")


class PayoutBalanceSerializer(serializers.Serializer):
    earnings = serializers.DecimalField(**MONEY, help_text="in your earnings account now")
    on_hold = serializers.DecimalField(**MONEY, help_text="earned less than hold_days ago (a reserved window: "
                                                          "until hold_days after it ends)")
    requested = serializers.DecimalField(**MONEY, help_text="your open request, not decided yet")
    in_flight = serializers.DecimalField(**MONEY, help_text="approved, its transfer on its way")
    paid = serializers.DecimalField(**MONEY, help_text="paid out in all")
    payable = serializers.DecimalField(max_digits=14, decimal_places=2, coerce_to_string=True,
                                       help_text="what you may request now")
    minimum = serializers.DecimalField(max_digits=14, decimal_places=2, coerce_to_string=True)
    hold_days = serializers.FloatField()
    next_release_at = serializers.DateTimeField(allow_null=True, help_text="when money on hold next becomes payable")
    transfers = serializers.ChoiceField(choices=["stripe", "simulated"],
                                        help_text="Stripe Connect transfers, or simulated ones (the demo)")


def _balance_body(user) -> dict:
    b = payouts.payout_balance(provider=user)
    return {"earnings": b.earnings, "on_hold": b.on_hold, "requested": b.requested, "in_flight": b.in_flight,
            "paid": b.paid, "payable": b.payable_cents, "minimum": b.minimum, "hold_days": b.hold_days,
            "next_release_at": b.next_release_at,
            "transfers": "simulated" if payouts.transfers_simulated() else "stripe"}


@extend_schema_view(list=extend_schema(responses={200: PayoutSerializer(many=True)}),
                    retrieve=extend_schema(responses={200: PayoutSerializer}))
class PayoutViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """A provider's payouts, newest first. POST {amount} requests one (an operator approves it; it is then
    transferred to your Stripe Connect account); POST /{id}/cancel/ withdraws a request not decided yet;
    GET balance/ says what is payable now."""

    serializer_class = PayoutSerializer
    write_scope = "provide"
    error_statuses = {"create": (409,), "cancel": (409,)}  # an open payout; the payout's state

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        payouts.provider_profile(request.user)  # 403 not_a_provider for an account that is not a provider

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator has no user
            return Payout.objects.none()
        return Payout.objects.filter(provider=self.request.user).order_by("-requested_at")

    @extend_schema(request=PayoutRequestSerializer,
                   responses={201: PayoutSerializer})
    def create(self, request):
        data = PayoutRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        payout = payouts.payout_request(provider=request.user, amount=data.validated_data["amount"])
        return Response(PayoutSerializer(payout).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: PayoutSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        payout = payouts.payout_cancel(provider=request.user, payout_id=self.get_object().pk)
        return Response(PayoutSerializer(payout).data)

    @extend_schema(responses={200: PayoutBalanceSerializer})
    @action(detail=False, methods=["get"])
    def balance(self, request):
        return Response(PayoutBalanceSerializer(_balance_body(request.user)).data)
