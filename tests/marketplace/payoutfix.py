"""Helpers of the payout tests: providers with a profile, earnings posted at a chosen time, the books of a payout."""
from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from django.db.models import Sum
from django.utils import timezone

from marketplace.models import LedgerEntry, LedgerTransaction, ProviderProfile
from marketplace.money import movements
from tests.factories import UserFactory
from tests.marketplace.marketsim import top_up


def provider_user(username: str | None = None, *, stripe_account: str = "", country: str = "US"):
    """A user who became a provider (accepted the terms, said where payouts go)."""
    user = UserFactory(**({"username": username} if username else {}))
    ProviderProfile.objects.create(user=user, display_name=f"{user.username} GPUs", terms_version="2026-11",
                                   terms_accepted_at=timezone.now(), payout_country=country,
                                   stripe_account_id=stripe_account)
    return user


def dated(txn: LedgerTransaction, when: datetime) -> LedgerTransaction:
    """Put a transaction (and its lines) at a fixed instant."""
    LedgerTransaction.objects.filter(pk=txn.pk).update(created_at=when)
    txn.entries.update(created_at=when)
    return txn


def earn(provider, gross: str, *, at: datetime, kind: str = "usage", buyer=None, order=None) -> LedgerTransaction:
    """A buyer pays `gross` USD for the provider's capacity at `at` (the provider earns it less the 10% fee)."""
    buyer = buyer or UserFactory()
    top_up(buyer, gross)
    return dated(movements.charge(kind=kind, buyer=buyer, provider=provider, amount=Decimal(gross), order=order,
                                  idempotency_key=f"test:{uuid.uuid4()}"), at)


def lines(kind: str, payout_id=None) -> dict[str, Decimal]:
    """account kind -> amount of the ledger lines of transactions of `kind` (of one payout when given)."""
    qs = LedgerEntry.objects.filter(transaction__kind=kind)
    if payout_id is not None:
        qs = qs.filter(transaction__idempotency_key__startswith=f"payout:{payout_id}")
    return {k: v for k, v in qs.values_list("account__kind").annotate(s=Sum("amount")).values_list(
        "account__kind", "s")}
