"""Money: projects, accounts, a double-entry ledger, Stripe payments and events, per-minute usage records.

Sign convention of the ledger: a LedgerEntry's amount is what it adds to its account's balance (positive
= the account holds more, negative = less), and the entries of one LedgerTransaction sum to exactly zero.
A top-up is stripe_clearing -X / wallet +X, so platform accounts may go negative (stripe_clearing is the
money the platform owes back to the outside world); user accounts may not.

The market's Lease and Order live in models/market.py and are built in parallel; to keep the migration graph
free of a cycle, transactions and usage records refer to them by plain indexed UUID columns (lease_id,
order_id) rather than foreign keys.
"""
from __future__ import annotations

import uuid
from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import F, Q

MONEY = {"max_digits": 18, "decimal_places": 6}  # micro-dollars; never float


class Project(models.Model):
    """A buyer's project: orders, leases and usage are grouped by it on statements."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="projects", on_delete=models.CASCADE)
    name = models.CharField(max_length=80)
    description = models.CharField(max_length=400, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class BudgetCap(models.TextChoices):
        # soft: alerts at 50/80/100% only; hard: at the cap new orders are refused and on-demand leases end
        SOFT = "soft", "soft (alerts only)"
        HARD = "hard", "hard (refuse and stop at the cap)"

    # A calendar month's spend limit in USD (UTC months); empty means no budget.
    monthly_budget = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)
    budget_cap = models.CharField(max_length=8, choices=BudgetCap.choices, default=BudgetCap.SOFT)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="project_name_unique_per_user"),
            models.CheckConstraint(condition=models.Q(monthly_budget__isnull=True) | models.Q(monthly_budget__gt=0),
                                   name="project_budget_positive"),
        ]

    def __str__(self) -> str:
        return self.name


class Account(models.Model):
    class Kind(models.TextChoices):
        WALLET = "wallet", "buyer wallet"
        EARNINGS = "earnings", "provider earnings"
        PLATFORM_FEES = "platform_fees", "platform fees"
        STRIPE_CLEARING = "stripe_clearing", "Stripe clearing"
        PROMOTIONS = "promotions", "promotions and credits"
        PAYOUTS_CLEARING = "payouts_clearing", "payouts in flight"

    USER_KINDS = (Kind.WALLET, Kind.EARNINGS)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, related_name="money_accounts",
                             on_delete=models.PROTECT)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    currency = models.CharField(max_length=3, default="usd")
    # A cache of sum(entries), updated in the same transaction as the entries; ledger_check() proves it.
    balance = models.DecimalField(**MONEY, default=Decimal("0"))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["user", "kind"], name="account_unique_per_user_kind"),
            # NULLs are distinct in a unique index: one platform account per kind needs its own constraint.
            models.UniqueConstraint(fields=["kind"], condition=Q(user__isnull=True), name="platform_account_unique"),
            models.CheckConstraint(condition=~Q(kind="wallet") | Q(balance__gte=0), name="wallet_balance_not_negative"),
            models.CheckConstraint(condition=Q(user__isnull=False, kind__in=["wallet", "earnings"])
                                   | Q(user__isnull=True) & ~Q(kind__in=["wallet", "earnings"]),
                                   name="account_owner_matches_kind"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.user_id or 'platform'}"


class LedgerTransaction(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=32, db_index=True)  # topup, refund, usage, reservation, resale, credit, ...
    memo = models.CharField(max_length=400)
    idempotency_key = models.CharField(max_length=200, unique=True, null=True, blank=True)
    lease_id = models.UUIDField(null=True, blank=True, db_index=True)
    order_id = models.UUIDField(null=True, blank=True, db_index=True)
    project = models.ForeignKey(Project, null=True, blank=True, related_name="transactions", on_delete=models.SET_NULL)
    # A charge's refunds so far, kept on the charge's row under its lock (ledger.refund): the database refuses
    # refunds adding up to more than what the wallet was charged.
    charged_amount = models.DecimalField(**MONEY, null=True, blank=True,
                                         help_text="what the wallet paid (set at its first refund)")
    refunded_amount = models.DecimalField(**MONEY, default=Decimal("0"))
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(refunded_amount=0) | Q(charged_amount__isnull=False, refunded_amount__gt=0,
                                                                      refunded_amount__lte=F("charged_amount")),
                                   name="ledgertransaction_refunds_within_charge"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.memo}"


class LedgerEntry(models.Model):
    transaction = models.ForeignKey(LedgerTransaction, related_name="entries", on_delete=models.PROTECT)
    # Indexed by (account, created_at) below: a second index on the account alone would only cost every insert.
    account = models.ForeignKey(Account, related_name="entries", on_delete=models.PROTECT, db_index=False)
    amount = models.DecimalField(**MONEY)  # what it adds to the account's balance; entries of a transaction sum to 0
    # The project this line belongs to: the transaction's, except where a transfer between two users books
    # each side under its own (a resale), and never the buyer's on a provider's earnings line.
    project = models.ForeignKey(Project, null=True, blank=True, related_name="entries", on_delete=models.SET_NULL,
                                db_index=False)  # read with the account's entries, never alone
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        verbose_name_plural = "ledger entries"
        indexes = [models.Index(fields=["account", "created_at"], name="ledgerentry_account_time")]
        constraints = [models.CheckConstraint(condition=~Q(amount=0), name="ledgerentry_amount_not_zero")]

    def __str__(self) -> str:
        return f"{self.account} {self.amount:+}"


class Payment(models.Model):
    """A wallet top-up through a Stripe PaymentIntent."""

    class Status(models.TextChoices):
        REQUIRES_PAYMENT_METHOD = "requires_payment_method"
        PROCESSING = "processing"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        REFUNDED = "refunded"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="payments", on_delete=models.PROTECT)
    stripe_payment_intent_id = models.CharField(max_length=255, unique=True)
    amount = models.DecimalField(max_digits=12, decimal_places=2)  # dollars, whole cents
    refunded_amount = models.DecimalField(max_digits=12, decimal_places=2, default=Decimal("0"))
    currency = models.CharField(max_length=3, default="usd")
    status = models.CharField(max_length=32, choices=Status.choices, default=Status.REQUIRES_PAYMENT_METHOD)
    failure_message = models.CharField(max_length=400, blank=True, default="")
    decline_code = models.CharField(max_length=80, blank=True, default="")
    # The client's Idempotency-Key for the top-up request: a retried POST returns the same payment.
    client_key = models.CharField(max_length=200, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="payment_amount_positive"),
            models.UniqueConstraint(fields=["user", "client_key"], name="payment_client_key_unique"),
            models.CheckConstraint(condition=Q(refunded_amount__gte=0) & Q(refunded_amount__lte=models.F("amount")),
                                   name="payment_refund_within_amount"),
        ]

    def __str__(self) -> str:
        return f"{self.stripe_payment_intent_id} {self.amount} {self.status}"


class StripeEvent(models.Model):
    """A verified Stripe webhook event, stored once: its unique id makes redelivery harmless."""

    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=100)
    received_at = models.DateTimeField(auto_now_add=True)
    processed = models.BooleanField(default=False)
    payload = models.JSONField(default=dict)

    class Meta:
        ordering = ["-received_at"]
        verbose_name = "Stripe event"

    def __str__(self) -> str:
        return f"{self.event_id} {self.type}"


class UsageRecord(models.Model):
    """What one lease used in one minute and what it cost; written by metering with the charge it points to
    (a charge spans one minute, or several when ticks were missed, shared over them to the micro-dollar)."""

    lease_id = models.UUIDField()
    order_id = models.UUIDField(null=True, blank=True, db_index=True)
    # Indexed by (buyer, minute) and (provider, minute) below, not alone: every lease-minute inserts a row.
    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="usage_records", on_delete=models.PROTECT,
                              db_index=False)
    provider = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="provided_usage", on_delete=models.PROTECT,
                                 db_index=False)
    project = models.ForeignKey(Project, null=True, blank=True, related_name="usage_records", on_delete=models.SET_NULL)
    node_id = models.UUIDField(null=True, blank=True, db_index=True)
    gpu_model = models.CharField(max_length=40)  # GpuModel key, e.g. "h100-80gb"
    profile = models.CharField(max_length=30)  # MIG profile, or "" / "whole" for the whole GPU
    mode = models.CharField(max_length=16, default="on_demand")
    minute = models.DateTimeField()  # start of the minute
    seconds = models.PositiveIntegerField()
    amount = models.DecimalField(**MONEY)
    fee = models.DecimalField(**MONEY, default=Decimal("0"))
    transaction = models.ForeignKey(LedgerTransaction, null=True, blank=True, related_name="usage_records",
                                    on_delete=models.PROTECT)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-minute"]
        constraints = [
            models.UniqueConstraint(fields=["lease_id", "minute"], name="usage_once_per_lease_minute"),
            models.CheckConstraint(condition=Q(seconds__gte=1) & Q(seconds__lte=60), name="usage_seconds_in_minute"),
            models.CheckConstraint(condition=Q(amount__gte=0) & Q(fee__gte=0) & Q(fee__lte=models.F("amount")),
                                   name="usage_amount_and_fee_valid"),
        ]
        indexes = [models.Index(fields=["buyer", "minute"], name="usage_buyer_minute"),
                   models.Index(fields=["provider", "minute"], name="usage_provider_minute")]

    def __str__(self) -> str:
        return f"{self.lease_id} {self.minute:%Y-%m-%d %H:%M} {self.seconds}s {self.amount}"


class LedgerCheck(models.Model):
    """One reconciliation of the ledger (money/check.py, run by beat): every balance against its entries and
    every transaction summing to zero. Operators see the problems in the admin; they are logged as errors."""

    ran_at = models.DateTimeField(auto_now_add=True, db_index=True)
    ok = models.BooleanField()
    problems = models.JSONField(default=list, blank=True)
    accounts = models.PositiveIntegerField(default=0)
    entries = models.PositiveBigIntegerField(default=0)
    seconds = models.FloatField(default=0)

    class Meta:
        ordering = ["-ran_at"]

    def __str__(self) -> str:
        return f"ledger check {self.ran_at:%Y-%m-%d %H:%M}: {'ok' if self.ok else f'{len(self.problems)} problems'}"


class BudgetNotice(models.Model):
    """What a project's hard cap said or did in one UTC month, once each: the notice N minutes before the cap
    (`notice`) and the end of its pay-as-you-go leases at the cap (`stopped`). The unique row makes a second
    tick (or a second beat worker) a no-op."""

    class Kind(models.TextChoices):
        NOTICE = "notice", "notice before the cap"
        STOPPED = "stopped", "leases ended at the cap"

    project = models.ForeignKey(Project, related_name="budget_notices", on_delete=models.CASCADE)
    month = models.CharField(max_length=7)  # "2026-12", UTC
    kind = models.CharField(max_length=8, choices=Kind.choices)
    budget = models.DecimalField(max_digits=12, decimal_places=2)
    spent = models.DecimalField(**MONEY)
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at"]
        constraints = [models.UniqueConstraint(fields=["project", "month", "kind"], name="budget_notice_once")]

    def __str__(self) -> str:
        return f"{self.project_id} {self.month} {self.kind}"


class AutoTopUp(models.Model):
    """A buyer's automatic top-up: a card saved through a Stripe SetupIntent, charged off session (a
    PaymentIntent with off_session=true) for `amount` when the wallet falls below `threshold` after a metering
    post. One top-up is in flight at a time (`in_flight_since`, taken by compare-and-set); after
    MARKET["AUTO_TOPUP_MAX_FAILURES"] failures in a row it turns itself off and says why."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, related_name="auto_topup", on_delete=models.CASCADE)
    enabled = models.BooleanField(default=False)
    threshold = models.DecimalField(max_digits=12, decimal_places=2, default=Decimal("10.00"))
    amount = models.DecimalField(max_digits=12, decimal_places=2, default=Decimal("50.00"))
    stripe_customer_id = models.CharField(max_length=64, blank=True)
    stripe_setup_intent_id = models.CharField(max_length=64, blank=True)
    stripe_payment_method_id = models.CharField(max_length=64, blank=True)
    card_label = models.CharField(max_length=40, blank=True, help_text="e.g. visa •••• 4242")
    in_flight_since = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)  # numbers each off-session charge's idempotency key
    failures = models.PositiveIntegerField(default=0)  # in a row; reset by a success
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=400, blank=True)
    last_payment = models.ForeignKey(Payment, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    disabled_reason = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(threshold__gte=0), name="auto_topup_threshold_not_negative"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="auto_topup_amount_positive"),
        ]

    def __str__(self) -> str:
        return f"auto top-up of {self.user_id}"
