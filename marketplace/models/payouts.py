"""Provider payouts: a provider asks to be paid (part of) its earnings, an operator approves or rejects, and the
approved amount is transferred to the provider's Stripe Connect account (a simulated transfer in the demo).
Every state change is one transaction of marketplace/money/payouts.py together with its ledger movement.

Amounts are whole cents (what a Stripe transfer moves). At most one payout of a provider is open (requested or
approved) at a time: the database refuses a second one whatever path it came by.
"""
import uuid
from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import F, Q


class Payout(models.Model):
    class State(models.TextChoices):
        REQUESTED = "requested", "requested"
        APPROVED = "approved", "approved, transfer on its way"
        PAID = "paid", "paid"
        FAILED = "failed", "failed, back in earnings"
        REJECTED = "rejected", "rejected"
        CANCELLED = "cancelled", "cancelled"

    OPEN_STATES = (State.REQUESTED, State.APPROVED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    provider = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="payouts", on_delete=models.PROTECT)
    amount = models.DecimalField(max_digits=12, decimal_places=2, help_text="USD, whole cents")
    currency = models.CharField(max_length=3, default="usd")
    state = models.CharField(max_length=10, choices=State.choices, default=State.REQUESTED, db_index=True)
    requested_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True, help_text="approved or rejected then")
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, related_name="payouts_decided",
                                   on_delete=models.SET_NULL)
    note = models.CharField(max_length=400, blank=True, help_text="the operator's reason for a rejection")
    # Where the money went: the provider's Connect account at approval ("" for a simulated transfer).
    destination = models.CharField(max_length=64, blank=True)
    transfer_id = models.CharField(max_length=255, null=True, blank=True, unique=True)
    simulated = models.BooleanField(default=False, help_text="paid by a simulated transfer (demo: no Stripe Connect)")
    paid_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    failure_reason = models.CharField(max_length=400, blank=True)
    last_error = models.CharField(max_length=400, blank=True,
                                  help_text="the last transient error sending the transfer (it is sent again)")
    reversed_amount = models.DecimalField(max_digits=12, decimal_places=2, default=Decimal("0"),
                                          help_text="reversed by Stripe after it was paid (transfer.reversed)")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-requested_at"]
        indexes = [models.Index(fields=["provider", "-requested_at"], name="payout_provider_time")]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="payout_amount_positive"),
            models.CheckConstraint(condition=Q(reversed_amount__gte=0) & Q(reversed_amount__lte=F("amount")),
                                   name="payout_reversal_within_amount"),
            models.UniqueConstraint(fields=["provider"], condition=Q(state__in=["requested", "approved"]),
                                    name="payout_one_open_per_provider"),
        ]

    def __str__(self) -> str:
        return f"payout {str(self.pk)[:8]} {self.amount} USD ({self.state})"
