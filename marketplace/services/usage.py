"""Metering: one UsageRecord per lease and minute, charged to the buyer's wallet in the same transaction."""
from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction

from marketplace.models import Project, UsageRecord
from marketplace.services import ledger
from scheduler.errors import DomainError


def usage_record(*, lease_id: uuid.UUID, buyer, provider, minute: datetime, seconds: int, amount: Decimal,
                 gpu_model: str, profile: str = "", order_id: uuid.UUID | None = None,
                 project: Project | None = None, node_id: uuid.UUID | None = None, mode: str = "on_demand",
                 fee_rate: Decimal | None = None) -> UsageRecord:
    """Record and charge one lease-minute exactly once; raises InsufficientFunds and writes nothing if broke."""
    if minute.tzinfo is None or minute.second or minute.microsecond:
        raise DomainError("a usage minute is an aware datetime at the start of a minute", field="minute")
    if not (1 <= seconds <= 60):
        raise DomainError("a usage minute holds 1 to 60 seconds", field="seconds")
    amount = ledger.money(amount)
    if amount < 0:
        raise DomainError("usage is never negative", field="amount")
    with transaction.atomic():
        existing = UsageRecord.objects.filter(lease_id=lease_id, minute=minute).first()
        if existing is not None:  # the metering task ran twice for this minute (retry, redelivery)
            return existing
        txn = None
        fee = Decimal("0")
        if amount > 0:
            txn = ledger.charge_usage(buyer=buyer, provider=provider, amount=amount, fee_rate=fee_rate,
                                      lease=lease_id, order=order_id, project=project,
                                      idempotency_key=f"usage:{lease_id}:{minute:%Y-%m-%dT%H:%M}",
                                      memo=f"{gpu_model} {profile or 'whole'} {seconds}s at {minute:%Y-%m-%d %H:%M}")
            fee = sum((e.amount for e in txn.entries.filter(account__kind="platform_fees")), Decimal("0"))
        try:
            with transaction.atomic():
                return UsageRecord.objects.create(lease_id=lease_id, order_id=order_id, buyer=buyer,
                                                  provider=provider, project=project, node_id=node_id,
                                                  gpu_model=gpu_model, profile=profile, mode=mode, minute=minute,
                                                  seconds=seconds, amount=amount, fee=fee, transaction=txn)
        except IntegrityError:
            # A concurrent run recorded this minute first; the ledger key made our charge its charge.
            return UsageRecord.objects.get(lease_id=lease_id, minute=minute)
