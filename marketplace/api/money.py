"""REST API of money: wallet, ledger entries, top-ups, payments and refunds, projects, usage, statements (a
provider's earnings and payouts are in payouts.py). Every queryset starts from request.user, so someone else's id
is a 404 like a missing one; a ledger line names an order only when the order is the user's own."""
from __future__ import annotations

import csv
import io
from datetime import datetime, time, timezone

from django.conf import settings
from django.db.models import Case, Exists, F, OuterRef, QuerySet, UUIDField, When
from django.utils.dateparse import parse_date, parse_datetime
from rest_framework import mixins, renderers, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from marketplace.api.json_only import JsonWrites
from marketplace.amounts import CENT, MICRO
from marketplace.models import Account, LedgerEntry, Order, Payment, Project, UsageRecord
from marketplace.money import statements
from marketplace.products import payments, projects
from scheduler.errors import DomainError


class CSVRenderer(renderers.BaseRenderer):
    """Renders a list of rows (lists) as CSV; anything else (an error) as one message row."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        out = io.StringIO()
        writer = csv.writer(out)
        if isinstance(data, list):
            writer.writerows(data)
        else:
            error = (data or {}).get("error", {}) if isinstance(data, dict) else {}
            writer.writerows([["error", "message"], [error.get("code", "error"), error.get("message", str(data))]])
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
                                  help_text="confirm on the server with this card number (scripts, tests)",
                                  error_messages={"invalid": "a card number has 16 digits"})


class RefundSerializer(serializers.Serializer):
    amount = serializers.DecimalField(max_digits=12, decimal_places=2, min_value=CENT, required=False,
                                      help_text="default: all that is left of the top-up")


class ProjectSerializer(serializers.ModelSerializer):
    class Meta:
        model = Project
        fields = ["id", "name", "description", "created_at"]
        read_only_fields = ["id", "created_at"]
        # The unique (user, name) rule is the service's to check: the serializer does not see the user.
        validators: list = []


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


class WalletViewSet(viewsets.ViewSet):
    """GET: the wallet balance, the earnings balance and the latest movements of the wallet."""

    def list(self, request):
        accounts = dict(Account.objects.filter(user=request.user).values_list("kind", "balance"))
        wallet_entries = LedgerEntry.objects.filter(account__user=request.user, account__kind=Account.Kind.WALLET)
        recent = with_own_order(wallet_entries.select_related("transaction", "account"),
                                request.user).order_by("-created_at", "-pk")[:20]
        wallet = accounts.get(Account.Kind.WALLET, ZERO_MICRO)
        return Response({"currency": "usd", "balance": str(wallet), "balance_usd": statements.cents(wallet),
                         "earnings_balance": str(accounts.get(Account.Kind.EARNINGS, ZERO_MICRO)),
                         "recent_entries": LedgerEntrySerializer(recent, many=True).data})


class LedgerEntryViewSet(viewsets.ReadOnlyModelViewSet):
    """The user's ledger entries (wallet and earnings); filters: account, kind, since, until, project."""

    serializer_class = LedgerEntrySerializer

    def get_queryset(self):
        mine = LedgerEntry.objects.filter(account__user=self.request.user).select_related("transaction", "account")
        qs = with_own_order(mine, self.request.user).order_by("-created_at", "-pk")
        params = self.request.query_params
        if params.get("account"):
            if params["account"] not in Account.USER_KINDS:
                raise DomainError("account is wallet or earnings", field="account")
            qs = qs.filter(account__kind=params["account"])
        if params.get("kind"):
            qs = qs.filter(transaction__kind=params["kind"])
        if params.get("since"):
            qs = qs.filter(created_at__gte=_instant(params["since"], "since"))
        if params.get("until"):
            qs = qs.filter(created_at__lte=_instant(params["until"], "until", end=True))
        if params.get("project"):
            qs = qs.filter(project=statements.user_project(user=self.request.user,
                                                                        project_id=params["project"]))
        return qs


class TopUpViewSet(JsonWrites, viewsets.GenericViewSet):
    """POST {amount, card?}: a Stripe PaymentIntent for the wallet. Send an Idempotency-Key header to retry safely.
    Without `card`, confirm it in the browser with Stripe.js (client_secret + publishable_key)."""

    serializer_class = TopUpSerializer

    def create(self, request):
        data = TopUpSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        payment = payments.topup_create(user=request.user, amount=data.validated_data["amount"],
                                        card=data.validated_data.get("card"),
                                        client_key=request.headers.get("Idempotency-Key"))
        return Response({"payment": PaymentSerializer(payment).data,
                         "payment_intent": payment.stripe_payment_intent_id,
                         "client_secret": getattr(payment, "client_secret", None),
                         "publishable_key": settings.STRIPE_PUBLISHABLE_KEY,
                         "stripe_js": payments.stripe_js_url()}, status=status.HTTP_201_CREATED)


class PaymentViewSet(JsonWrites, viewsets.ReadOnlyModelViewSet):
    """The user's top-ups. POST /payments/{id}/refund/ {amount?} refunds the unspent part to the card."""

    serializer_class = PaymentSerializer

    def get_queryset(self):
        qs = Payment.objects.filter(user=self.request.user).order_by("-created_at")
        if self.request.query_params.get("status"):
            qs = qs.filter(status=self.request.query_params["status"])
        return qs

    @action(detail=True, methods=["post"], serializer_class=RefundSerializer)
    def refund(self, request, pk=None):
        payment = self.get_object()  # 404 for someone else's payment
        data = RefundSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        payment = payments.payment_refund(payment_id=payment.pk, user=request.user,
                                          amount=data.validated_data.get("amount"))
        return Response(PaymentSerializer(payment).data)


class ProjectViewSet(JsonWrites, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The buyer's projects: create, rename, delete (only while nothing was billed to it)."""

    serializer_class = ProjectSerializer

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


class UsageRecordViewSet(viewsets.ReadOnlyModelViewSet):
    """Per-minute usage of the buyer's leases; filters: lease, project, month (YYYY-MM)."""

    serializer_class = UsageRecordSerializer

    def get_queryset(self):
        qs = UsageRecord.objects.filter(buyer=self.request.user).order_by("-minute", "-pk")
        params = self.request.query_params
        if params.get("lease"):
            try:
                qs = qs.filter(lease_id=serializers.UUIDField().to_internal_value(params["lease"]))
            except serializers.ValidationError:
                raise DomainError("lease is a UUID", field="lease") from None
        if params.get("project"):
            qs = qs.filter(project=statements.user_project(user=self.request.user, project_id=params["project"]))
        if params.get("month"):
            _, start, end = statements.month_bounds(params["month"])
            qs = qs.filter(minute__gte=start, minute__lt=end)
        return qs


class StatementViewSet(viewsets.ViewSet):
    """GET ?month=YYYY-MM&project=ID: the month per project and slice; ?format=csv for a spreadsheet."""

    renderer_classes = [renderers.JSONRenderer, renderers.BrowsableAPIRenderer, CSVRenderer]

    def list(self, request):
        body = statements.statement(user=request.user, month=request.query_params.get("month"),
                                    project_id=request.query_params.get("project"))
        if request.accepted_renderer.format == "csv":
            return Response(statements.statement_csv_rows(body), headers={
                "Content-Disposition": f'attachment; filename="statement-{body["month"]}.csv"'})
        return Response(body)
