"""REST API of money: wallet, ledger entries, top-ups, payments and refunds, projects, usage, statements (a
provider's earnings and payouts are in payouts.py). Every queryset starts from request.user, so someone else's id
is a 404 like a missing one; a ledger line names an order only when the order is the user's own. Writes need an
API key's `trade` scope."""
from __future__ import annotations

import csv
import io
from datetime import datetime, time, timezone
from decimal import Decimal

from django.conf import settings
from django.utils import timezone as django_tz
from django.db.models import Case, Exists, F, OuterRef, QuerySet, UUIDField, When
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, extend_schema_serializer
from rest_framework import mixins, renderers, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from marketplace.amounts import CENT, MICRO
from marketplace.api.filtering import query_values
from marketplace.models import Account, AutoTopUp, LedgerEntry, Order, Payment, Project, UsageRecord
from marketplace.lifecycle import budgets
from marketplace.money import statements
from marketplace.products import payments, projects
from scheduler.errors import DomainError


class CSVRenderer(renderers.BaseRenderer):
    """Renders a list of rows (lists) as CSV. Errors are JSON whatever the format asked (api/errors.py)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        out = io.StringIO()
        csv.writer(out).writerows(data)
        return out.getvalue().encode("utf-8")


class TransactionSerializer(serializers.Serializer):
    id = serializers.UUIDField(source="transaction.id")
    kind = serializers.CharField(source="transaction.kind")
    memo = serializers.CharField(source="transaction.memo")
    lease_id = serializers.UUIDField(source="transaction.lease_id", allow_null=True)
    order_id = serializers.UUIDField(source="own_order_id", allow_null=True,
                                     help_text="your order; null on a line of someone else's (a provider's "
                                               "earnings, a resale seller's proceeds)")


def with_own_order(qs: QuerySet, user) -> QuerySet:
    """Ledger entries with `own_order_id`: their transaction's order when it is `user`'s own, else None. A provider's
    earnings line and a resale seller's proceeds sit in the buyer's transaction: its order is the buyer's."""
    own = Exists(Order.objects.filter(pk=OuterRef("transaction__order_id"), buyer=user))
    return qs.annotate(own_order_id=Case(When(own, then=F("transaction__order_id")), default=None,
                                         output_field=UUIDField()))


class LedgerEntrySerializer(serializers.ModelSerializer):
    account = serializers.CharField(source="account.kind")
    project = serializers.IntegerField(source="project_id", allow_null=True,
                                       help_text="the project this line is booked under (yours)")
    transaction = TransactionSerializer(source="*")

    class Meta:
        model = LedgerEntry
        fields = ["id", "account", "amount", "project", "transaction", "created_at"]
        read_only_fields = fields


class PaymentSerializer(serializers.ModelSerializer):
    payment_intent = serializers.CharField(source="stripe_payment_intent_id")

    class Meta:
        model = Payment
        fields = ["id", "payment_intent", "amount", "refunded_amount", "currency", "status", "failure_message",
                  "decline_code", "created_at", "updated_at"]
        read_only_fields = fields


class TopUpSerializer(serializers.Serializer):
    amount = serializers.DecimalField(max_digits=12, decimal_places=2, min_value=payments.TOPUP_MIN,
                                      max_value=payments.TOPUP_MAX)
    card = serializers.RegexField(r"^\d{16}$", required=False,
                                  help_text="confirm on the server with this card number (scripts, tests; test-mode "
                                            "Stripe only)",
                                  error_messages={"invalid": "a card number has 16 digits"})


class RefundSerializer(serializers.Serializer):
    amount = serializers.DecimalField(max_digits=12, decimal_places=2, min_value=CENT, required=False,
                                      help_text="default: all that is left of the top-up")


class ProjectSerializer(serializers.ModelSerializer):
    monthly_budget = serializers.DecimalField(
        max_digits=12, decimal_places=2, min_value=Decimal("0.01"), allow_null=True, required=False,
        help_text="USD per UTC calendar month, whole cents; null: no budget")
    budget_cap = serializers.ChoiceField(
        choices=Project.BudgetCap.choices, required=False,
        help_text="soft: alerts only; hard: orders that would pass the budget are refused and on-demand and spot "
                  "leases end at it (with a notice before)")

    class Meta:
        model = Project
        fields = ["id", "name", "description", "monthly_budget", "budget_cap", "created_at"]
        read_only_fields = ["id", "created_at"]
        # The unique (user, name) rule is the service's to check: the serializer does not see the user.
        validators: list = []


class ProjectBudgetSerializer(serializers.Serializer):
    month = serializers.CharField(help_text="YYYY-MM, UTC")
    budget = serializers.DecimalField(max_digits=12, decimal_places=2, allow_null=True)
    cap = serializers.ChoiceField(choices=Project.BudgetCap.choices)
    spent = serializers.DecimalField(max_digits=18, decimal_places=6,
                                     help_text="month to date: what the project's statement totals")
    held = serializers.DecimalField(max_digits=18, decimal_places=6,
                                    help_text="what its on-demand and spot leases hold: owed, and their next minutes")
    left = serializers.DecimalField(max_digits=18, decimal_places=6, allow_null=True,
                                    help_text="budget less spent and held; null without a budget")


class UsageRecordSerializer(serializers.ModelSerializer):
    class Meta:
        model = UsageRecord
        fields = ["id", "lease_id", "order_id", "project", "node_id", "gpu_model", "profile", "mode", "minute",
                  "seconds", "amount", "created_at"]
        read_only_fields = fields


def _instant(value: str, name: str, *, end: bool = False) -> datetime:
    """An ISO date (whole day) or datetime from a query parameter."""
    parsed = parse_datetime(value) if "T" in value or " " in value else None
    if parsed is None:
        day = parse_date(value) if len(value) == 10 else None
        if day is None:
            raise DomainError(f"{name} is an ISO date or datetime, e.g. 2026-11-01", field=name)
        parsed = datetime.combine(day, time.max if end else time.min)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


ZERO_MICRO = MICRO * 0
MONEY_SCOPE = "trade"


@extend_schema_field({"type": "string", "pattern": r"^\d{4}-\d{2}$", "example": "2026-11"})
class MonthField(serializers.CharField):
    """YYYY-MM: the schema says so; statements.month_bounds checks it (its error names the field)."""

    def __init__(self, **kw):
        super().__init__(max_length=7, required=False, **kw)
AMOUNT = {"help_text": "USD, exact (micro-dollars)"}
AMOUNT_USD = {"help_text": "USD, rounded half-up to the cent"}


@extend_schema_serializer(many=False)
class WalletSerializer(serializers.Serializer):
    currency = serializers.CharField()
    balance = serializers.CharField(**AMOUNT)
    balance_usd = serializers.CharField(**AMOUNT_USD)
    earnings_balance = serializers.CharField(**AMOUNT)
    recent_entries = LedgerEntrySerializer(many=True, help_text="the latest 20 movements of the wallet")


class LedgerFilterSerializer(serializers.Serializer):
    account = serializers.ChoiceField(choices=Account.USER_KINDS, required=False)
    kind = serializers.CharField(max_length=40, required=False, help_text="a transaction kind: topup, usage, ...")
    since = serializers.CharField(max_length=40, required=False, help_text="an ISO date or datetime")
    until = serializers.CharField(max_length=40, required=False, help_text="an ISO date (the whole day) or datetime")
    project = serializers.IntegerField(min_value=1, required=False, help_text="one of your projects")


class PaymentFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Payment.Status.choices, required=False)


class UsageFilterSerializer(serializers.Serializer):
    lease = serializers.UUIDField(required=False)
    project = serializers.IntegerField(min_value=1, required=False, help_text="one of your projects")
    month = MonthField(help_text="YYYY-MM")


class StatementQuerySerializer(serializers.Serializer):
    month = MonthField(help_text="YYYY-MM (default: this month)")
    project = serializers.IntegerField(min_value=1, required=False, help_text="only this project of yours")



class TopUpResultSerializer(serializers.Serializer):
    payment = PaymentSerializer()
    payment_intent = serializers.CharField()
    client_secret = serializers.CharField(allow_null=True, help_text="confirm it in the browser with Stripe.js")
    publishable_key = serializers.CharField(allow_null=True, allow_blank=True)
    stripe_js = serializers.CharField(help_text="where to load Stripe.js from")


@extend_schema_serializer(many=False)  # GET /auto-topup/ is the user's one row, not a list
class AutoTopUpSerializer(serializers.ModelSerializer):
    card = serializers.CharField(source="card_label", help_text="the saved card, e.g. visa •••• 4242; empty: none")
    in_flight = serializers.SerializerMethodField(help_text="a charge is being made now")

    class Meta:
        model = AutoTopUp
        fields = ["enabled", "threshold", "amount", "card", "in_flight", "failures", "last_attempt_at", "last_error",
                  "disabled_reason"]
        read_only_fields = fields

    def get_in_flight(self, row) -> bool:
        return row.in_flight_since is not None


class AutoTopUpSetSerializer(serializers.Serializer):
    enabled = serializers.BooleanField()
    threshold = serializers.DecimalField(max_digits=12, decimal_places=2, min_value=Decimal("0"),
                                         max_value=payments.TOPUP_MAX,
                                         help_text="top up when the wallet is under this after a metering post")
    amount = serializers.DecimalField(max_digits=12, decimal_places=2, min_value=payments.TOPUP_MIN,
                                      max_value=payments.TOPUP_MAX, help_text="how much each top-up adds")


class CardSetupSerializer(serializers.Serializer):
    setup_intent = serializers.CharField()
    client_secret = serializers.CharField(help_text="confirm it in the browser with Stripe.js (confirmCardSetup)")
    publishable_key = serializers.CharField(allow_blank=True)
    stripe_js = serializers.CharField(help_text="where to load Stripe.js from")


class CardConfirmSerializer(serializers.Serializer):
    card = serializers.RegexField(r"^\d{16}$", required=False,
                                  help_text="confirm on the server with this card number (scripts, tests; test-mode "
                                            "Stripe only); without it, the card confirmed in the browser is kept",
                                  error_messages={"invalid": "a card number has 16 digits"})


class ProjectRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField(allow_null=True)


class NodeRefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField(allow_null=True)


class StatementSliceSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    profile = serializers.CharField()
    gpu_seconds = serializers.IntegerField()
    gpu_hours = serializers.CharField()
    amount = serializers.CharField(**AMOUNT)
    amount_usd = serializers.CharField(**AMOUNT_USD)


class ChargeSerializer(serializers.Serializer):
    kind = serializers.CharField()
    label = serializers.CharField(help_text="the kind in words: reserved windows, resale market, ...")
    amount = serializers.CharField(**AMOUNT)
    amount_usd = serializers.CharField(**AMOUNT_USD)


class StatementProjectSerializer(serializers.Serializer):
    project = ProjectRefSerializer(allow_null=True, help_text="null: usage under no project")
    slices = StatementSliceSerializer(many=True)
    gpu_seconds = serializers.IntegerField()
    usage_amount = serializers.CharField(**AMOUNT)
    usage_amount_usd = serializers.CharField(**AMOUNT_USD)
    other_charges = ChargeSerializer(many=True)
    total = serializers.CharField(**AMOUNT)
    total_usd = serializers.CharField(**AMOUNT_USD)


class StatementTotalsSerializer(serializers.Serializer):
    gpu_seconds = serializers.IntegerField()
    usage_amount = serializers.CharField(**AMOUNT)
    usage_amount_usd = serializers.CharField(**AMOUNT_USD)
    other_charges_amount = serializers.CharField(**AMOUNT)
    amount = serializers.CharField(**AMOUNT)
    amount_usd = serializers.CharField(**AMOUNT_USD)
    credits_amount = serializers.CharField(**AMOUNT)
    credits_amount_usd = serializers.CharField(**AMOUNT_USD)


class StatementWalletSerializer(serializers.Serializer):
    opening_balance = serializers.CharField(**AMOUNT)
    closing_balance = serializers.CharField(**AMOUNT)
    opening_balance_usd = serializers.CharField(**AMOUNT_USD)
    closing_balance_usd = serializers.CharField(**AMOUNT_USD)
    movements = serializers.DictField(child=serializers.CharField(), help_text="the month's total per kind")


@extend_schema_serializer(many=False)
class StatementSerializer(serializers.Serializer):
    """A buyer's month: per project and slice, GPU-seconds and amounts; the wallet's movements (all projects)."""

    month = serializers.CharField()
    currency = serializers.CharField()
    period_start = serializers.DateTimeField()
    period_end = serializers.DateTimeField()
    projects = StatementProjectSerializer(many=True)
    totals = StatementTotalsSerializer()
    wallet = StatementWalletSerializer(required=False, help_text="only without ?project=")





class WalletViewSet(viewsets.ViewSet):
    """GET: the wallet balance, the earnings balance and the latest movements of the wallet."""

    @extend_schema(operation_id="wallet_retrieve", responses=WalletSerializer)
    def list(self, request):
        accounts = dict(Account.objects.filter(user=request.user).values_list("kind", "balance"))
        wallet_entries = LedgerEntry.objects.filter(account__user=request.user, account__kind=Account.Kind.WALLET)
        recent = with_own_order(wallet_entries.select_related("transaction", "account"),
                                request.user).order_by("-created_at", "-pk")[:20]
        wallet = accounts.get(Account.Kind.WALLET, ZERO_MICRO)
        return Response(WalletSerializer({
            "currency": "usd", "balance": str(wallet), "balance_usd": statements.cents(wallet),
            "earnings_balance": str(accounts.get(Account.Kind.EARNINGS, ZERO_MICRO)), "recent_entries": recent}).data)


class LedgerEntryViewSet(viewsets.ReadOnlyModelViewSet):
    """The user's ledger entries (wallet and earnings); filters: account, kind, since, until, project."""

    serializer_class = LedgerEntrySerializer
    queryset = LedgerEntry.objects.none()
    filter_serializer = LedgerFilterSerializer
    error_statuses = {"list": (404,)}  # a project that is not yours

    def get_queryset(self):
        mine = LedgerEntry.objects.filter(account__user=self.request.user).select_related("transaction", "account")
        return with_own_order(mine, self.request.user).order_by("-created_at", "-pk")

    def filtered(self, qs, values: dict):
        if "account" in values:
            qs = qs.filter(account__kind=values["account"])
        if "kind" in values:
            qs = qs.filter(transaction__kind=values["kind"])
        if "since" in values:
            qs = qs.filter(created_at__gte=_instant(values["since"], "since"))
        if "until" in values:
            qs = qs.filter(created_at__lte=_instant(values["until"], "until", end=True))
        if "project" in values:
            qs = qs.filter(project=statements.user_project(user=self.request.user, project_id=values["project"]))
        return qs


class TopUpViewSet(viewsets.GenericViewSet):
    """POST {amount, card?}: a Stripe PaymentIntent for the wallet. Send an Idempotency-Key header to retry safely.
    Without `card`, confirm it in the browser with Stripe.js (client_secret + publishable_key)."""

    serializer_class = TopUpSerializer
    write_scope = MONEY_SCOPE
    error_statuses = {"create": (409, 502)}

    @extend_schema(request=TopUpSerializer, responses={201: TopUpResultSerializer}, parameters=[
        OpenApiParameter("Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER,
                         description="1 to 200 characters: a retried request with it returns the same payment")])
    def create(self, request):
        data = TopUpSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        payment = payments.topup_create(user=request.user, amount=data.validated_data["amount"],
                                        card=data.validated_data.get("card"),
                                        client_key=request.headers.get("Idempotency-Key"))
        return Response(TopUpResultSerializer({
            "payment": payment, "payment_intent": payment.stripe_payment_intent_id,
            "client_secret": getattr(payment, "client_secret", None),
            "publishable_key": settings.STRIPE_PUBLISHABLE_KEY, "stripe_js": payments.stripe_js_url()}).data,
            status=status.HTTP_201_CREATED)


class AutoTopUpViewSet(viewsets.ViewSet):
    """Auto top-up from a saved card: GET the settings; POST {enabled, threshold, amount} sets them; POST card/ starts
    saving a card (a Stripe SetupIntent to confirm with Stripe.js), POST card/confirm/ {card?} keeps it."""

    write_scope = MONEY_SCOPE
    error_statuses = {"create": (409,), "card": (502,), "card_confirm": (402, 409, 502)}

    @extend_schema(operation_id="auto_topup_retrieve", responses=AutoTopUpSerializer)
    def list(self, request):
        return Response(AutoTopUpSerializer(payments.auto_topup_of(user=request.user)).data)

    @extend_schema(operation_id="auto_topup_set", request=AutoTopUpSetSerializer, responses=AutoTopUpSerializer)
    def create(self, request):
        data = AutoTopUpSetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        row = payments.auto_topup_configure(user=request.user, **data.validated_data)
        return Response(AutoTopUpSerializer(row).data)

    @extend_schema(operation_id="auto_topup_card_setup", request=None, responses=CardSetupSerializer)
    @action(detail=False, methods=["post"])
    def card(self, request):
        row, secret = payments.card_setup_start(user=request.user)
        return Response(CardSetupSerializer({"setup_intent": row.stripe_setup_intent_id, "client_secret": secret,
                                             "publishable_key": settings.STRIPE_PUBLISHABLE_KEY,
                                             "stripe_js": payments.stripe_js_url()}).data)

    @extend_schema(operation_id="auto_topup_card_confirm", request=CardConfirmSerializer,
                   responses=AutoTopUpSerializer)
    @action(detail=False, methods=["post"], url_path="card/confirm")
    def card_confirm(self, request):
        data = CardConfirmSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        row = payments.card_setup_finish(user=request.user, card=data.validated_data.get("card"))
        return Response(AutoTopUpSerializer(row).data)


class PaymentViewSet(viewsets.ReadOnlyModelViewSet):
    """The user's top-ups. POST /payments/{id}/refund/ {amount?} refunds the unspent part to the card."""

    serializer_class = PaymentSerializer
    queryset = Payment.objects.none()
    filter_serializer = PaymentFilterSerializer
    write_scope = MONEY_SCOPE
    error_statuses = {"refund": (402, 409, 502)}

    def get_queryset(self):
        return Payment.objects.filter(user=self.request.user).order_by("-created_at")

    @extend_schema(request=RefundSerializer, responses=PaymentSerializer)
    @action(detail=True, methods=["post"], serializer_class=RefundSerializer)
    def refund(self, request, pk=None):
        payment = self.get_object()  # 404 for someone else's payment
        data = RefundSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        payment = payments.payment_refund(payment_id=payment.pk, user=request.user,
                                          amount=data.validated_data.get("amount"))
        return Response(PaymentSerializer(payment).data)


class ProjectViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The buyer's projects: create, rename, delete (only while nothing was billed to it)."""

    serializer_class = ProjectSerializer
    queryset = Project.objects.none()
    write_scope = MONEY_SCOPE
    error_statuses = {"create": (409,), "update": (409,), "partial_update": (409,), "destroy": (409,)}

    def get_queryset(self):
        return Project.objects.filter(user=self.request.user).order_by("name")

    def create(self, request):
        data = ProjectSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        project = projects.project_create(user=request.user, **data.validated_data)
        return Response(ProjectSerializer(project).data, status=status.HTTP_201_CREATED)

    def update(self, request, pk=None, partial=False):
        project = self.get_object()
        data = ProjectSerializer(project, data=request.data, partial=partial)
        data.is_valid(raise_exception=True)
        project = projects.project_update(project=project, **data.validated_data)
        return Response(ProjectSerializer(project).data)

    def partial_update(self, request, pk=None):
        return self.update(request, pk, partial=True)

    def destroy(self, request, pk=None):
        projects.project_delete(project=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=ProjectBudgetSerializer)
    @action(detail=True, methods=["get"])
    def budget(self, request, pk=None):
        """The project's month so far against its budget: spent, held by running leases, left."""
        state = budgets.budget_state(project=self.get_object(), now=django_tz.now())
        return Response(ProjectBudgetSerializer({"month": state.month, "budget": state.budget, "cap": state.cap,
                                                 "spent": state.spent, "held": state.held,
                                                 "left": state.left}).data)


class UsageRecordViewSet(viewsets.ReadOnlyModelViewSet):
    """Per-minute usage of the buyer's leases; filters: lease, project, month (YYYY-MM)."""

    serializer_class = UsageRecordSerializer
    queryset = UsageRecord.objects.none()
    filter_serializer = UsageFilterSerializer
    error_statuses = {"list": (404,)}  # a project that is not yours

    def get_queryset(self):
        return UsageRecord.objects.filter(buyer=self.request.user).order_by("-minute", "-pk")

    def filtered(self, qs, values: dict):
        if "lease" in values:
            qs = qs.filter(lease_id=values["lease"])
        if "project" in values:
            qs = qs.filter(project=statements.user_project(user=self.request.user, project_id=values["project"]))
        if "month" in values:
            _, start, end = statements.month_bounds(values["month"])
            qs = qs.filter(minute__gte=start, minute__lt=end)
        return qs


class StatementViewSet(viewsets.ViewSet):
    """GET ?month=YYYY-MM&project=ID: the month per project and slice; ?format=csv for a spreadsheet."""

    renderer_classes = [renderers.JSONRenderer, CSVRenderer]
    error_statuses = {"list": (404,)}  # a project that is not yours

    @extend_schema(operation_id="statements_retrieve", parameters=[StatementQuerySerializer], responses={
        (200, "application/json"): StatementSerializer,
        (200, "text/csv"): OpenApiTypes.STR})
    def list(self, request):
        q = query_values(StatementQuerySerializer, request)
        body = StatementSerializer(statements.statement(user=request.user, month=q.get("month"),
                                                        project_id=q.get("project"))).data
        if request.accepted_renderer.format == "csv":
            return Response(statements.statement_csv_rows(body), headers={
                "Content-Disposition": f'attachment; filename="statement-{body["month"]}.csv"'})
        return Response(body)
