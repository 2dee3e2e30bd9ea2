"""Named movements of money, each one balanced posting through the ledger writer (ledger.py):

| movement            | lines                                                        | kind        |
|---------------------|--------------------------------------------------------------|-------------|
| `charge_usage`      | buyer wallet −a; provider earnings +(a − fee); fees +fee      | usage       |
| `charge`            | the same for a prepaid window (a reservation booking)         | reservation |
| `refund`            | the mirror of (part of) a charge, pro rata over its lines     | reversal    |
| `credit`            | promotions −a; wallet +a (short spot notice, welcome, undelivered time) | credit |
| `topup`             | stripe_clearing −a; wallet +a                                 | topup       |
| `topup_refund`      | wallet −a; stripe_clearing +a                                 | refund      |
| `resale_sale`       | buyer wallet −a; seller wallet +(a − fee); fees +fee          | resale      |
| `payout`            | provider earnings −a; payouts_clearing +a (an approved payout) | payout     |
| `payout_sent`       | payouts_clearing −a; stripe_clearing +a (its transfer left)   | payout_sent |
| `payout_return`     | payouts_clearing (failed) or stripe_clearing (reversed) −a; earnings +a | payout_return |

The platform fee is computed once, here (`fee_of`), and read back from the posting wherever it is shown.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db import transaction

from marketplace.amounts import MICRO, ZERO, money, usd
from marketplace.models import Account, LedgerTransaction
from scheduler.errors import DomainError

from . import ledger
from .ledger import InsufficientFunds, Posting, key_of

__all__ = ["InsufficientFunds", "fee_of", "charge_usage", "charge", "refund", "refundable", "credit", "topup",
           "topup_refund", "resale_sale", "payout", "payout_sent", "payout_return", "PAYOUT_KINDS", "UsageCharge",
           "UsagePosted"]

FEES = (None, "platform_fees")
CLEARING = (None, "stripe_clearing")
PROMOTIONS = (None, "promotions")
PAYOUTS = (None, "payouts_clearing")
# Transactions that pay earnings out (or bring them back): never earnings themselves.
PAYOUT_KINDS = ("payout", "payout_sent", "payout_return")


def fee_of(amount: Decimal, *, rate: Decimal | None = None) -> Decimal:
    """The platform fee on `amount` (PLATFORM_FEE_RATE), half-up to the micro-dollar, never more than it."""
    rate = settings.PLATFORM_FEE_RATE if rate is None else Decimal(rate)
    return min(amount, (money(amount) * rate).quantize(MICRO, rounding=ROUND_HALF_UP))


def _positive(amount, field: str = "amount") -> Decimal:
    amount = money(amount, field=field)
    if amount <= 0:
        raise DomainError(f"{field} must be a positive amount", field=field)
    return amount


def _sale_lines(*, payer: tuple, payee: tuple, amount: Decimal, fee: Decimal, payer_project=None,
                payee_project=None) -> list:
    """The payer's line is booked under the posting's project unless told otherwise; the payee's under its
    own project (none: a provider's earnings never carry the buyer's project), the fee under none."""
    payer_line = (payer, -amount) if payer_project is None else (payer, -amount, payer_project)
    return [payer_line, (payee, amount - fee, payee_project), (FEES, fee, None)]


# --- usage ----------------------------------------------------------------------------------------------

@dataclass
class UsageCharge:
    """What a lease owes for [start, end): `due`, charged to its buyer's wallet for its provider."""

    lease_id: uuid.UUID
    buyer_id: int
    provider_id: int
    due: Decimal
    start: datetime
    end: datetime
    order_id: uuid.UUID | None = None
    project_id: int | None = None
    memo: str = ""


@dataclass
class UsagePosted:
    item: UsageCharge
    amount: Decimal  # what was charged: `due`, or less when the wallet ran dry
    fee: Decimal
    transaction_id: uuid.UUID | None


def charge_usage(items: list[UsageCharge]) -> list[UsagePosted]:
    """Charge metered usage of many leases in one batch. A wallet is never taken below zero: each item gets
    what its buyer's wallet still holds (items in order), so `amount < due` says the money ran out."""
    out: list[UsagePosted] = []
    if not items:
        return out
    with transaction.atomic():
        # Lock the buyers' wallets (with the other accounts, pk order): the race is another charge or a
        # refund spending the same wallet between our read and our write.
        keys = {key_of(user=i.buyer_id, kind="wallet") for i in items}
        keys |= {key_of(user=i.provider_id, kind="earnings") for i in items} | {FEES}
        available = {k[0]: bal for k, (_, bal) in ledger.locked_balances(keys).items() if k[1] == "wallet"}
        postings = []
        for item in items:
            amount = min(money(item.due), max(ZERO, available[item.buyer_id]))
            if amount <= 0:
                out.append(UsagePosted(item, ZERO, ZERO, None))
                continue
            available[item.buyer_id] -= amount
            fee = fee_of(amount)
            p = Posting(kind="usage", memo=item.memo or f"usage {amount} USD",
                        idempotency_key=f"usage:{item.lease_id}:{int(item.start.timestamp())}-"
                                        f"{int(item.end.timestamp())}",
                        lease_id=item.lease_id, order_id=item.order_id, project_id=item.project_id,
                        lines=_sale_lines(payer=(item.buyer_id, "wallet"), payee=(item.provider_id, "earnings"),
                                          amount=amount, fee=fee))
            postings.append(p)
            out.append(UsagePosted(item, amount, fee, p.id))
        written = {t.idempotency_key: t.pk for t in ledger.post_many(postings)}
        for posted in out:  # a key seen before (a retried tick) points at the transaction written then
            if posted.transaction_id is not None:
                key = f"usage:{posted.item.lease_id}:{int(posted.item.start.timestamp())}-" \
                      f"{int(posted.item.end.timestamp())}"
                posted.transaction_id = written.get(key, posted.transaction_id)
    return out


# --- charges, refunds, credits ----------------------------------------------------------------------------

def charge(*, kind: str, buyer, provider, amount: Decimal, idempotency_key: str, memo: str = "", lease=None,
           order=None, project=None, fee_rate: Decimal | None = None) -> LedgerTransaction:
    """Move `amount` from the buyer's wallet: the provider's earnings get it less the platform fee (at
    `fee_rate`, default PLATFORM_FEE_RATE)."""
    amount = _positive(amount)
    return ledger.post(kind=kind, memo=memo or f"{kind} {amount} USD", idempotency_key=idempotency_key,
                       lease=lease, order=order, project=project,
                       lines=_sale_lines(payer=key_of(user=buyer, kind="wallet"),
                                         payee=key_of(user=provider, kind="earnings"), amount=amount,
                                         fee=fee_of(amount, rate=fee_rate)))


def refundable(*, original: LedgerTransaction) -> tuple[Decimal, Decimal]:
    """(what the wallet was charged by `original`, what is left to refund of it)."""
    charged = -sum(original.entries.filter(amount__lt=0, account__kind=Account.Kind.WALLET)
                   .values_list("amount", flat=True), ZERO)
    return charged, charged - original.refunded_amount


def refund(*, original: LedgerTransaction, idempotency_key: str, memo: str = "",
           amount: Decimal | None = None) -> LedgerTransaction:
    """Give the buyer back `amount` (default all that is left) of a charge, taken pro rata from each of its
    lines (provider and platform fee). Refunds of one charge never add up to more than it charged; a known
    key returns its refund."""
    with transaction.atomic():
        # Lock the charge: the race is two refunds of it under different keys (a failed provision and an
        # operator, say) both reading the same amount left and together giving back more than was paid.
        original = LedgerTransaction.objects.select_for_update().get(pk=original.pk)
        existing = LedgerTransaction.objects.filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            return ledger._same_or_conflict(existing, "reversal")
        charged, left = refundable(original=original)
        if not charged:
            raise DomainError("only a charge to a wallet can be refunded")
        amount = left if amount is None else money(amount)
        if not (0 < amount <= left):
            raise DomainError(f"a refund is between 0 and the {left} USD left of the charged {charged} USD",
                              field="amount", code="refund_exceeds_charge",
                              details={"charged": str(charged), "refunded": str(original.refunded_amount)})
        fraction = amount / charged
        rows = list(original.entries.select_related("account").order_by("pk"))
        lines = [[e.account, -(e.amount * fraction).quantize(MICRO, rounding=ROUND_HALF_UP), e.project_id]
                 for e in rows]
        # Rounding each line may leave a micro-dollar over: the platform line (if any) absorbs it.
        rest = -sum((a for _, a, _ in lines), ZERO)
        if rest:
            i = next((i for i, (acc, _, _) in enumerate(lines) if acc.user_id is None), len(lines) - 1)
            lines[i][1] += rest
        txn = ledger.post(kind="reversal", memo=memo or f"refund of {original.kind}", lines=lines,
                          idempotency_key=idempotency_key, lease=original.lease_id, order=original.order_id,
                          project=original.project_id)
        LedgerTransaction.objects.filter(pk=original.pk).update(charged_amount=charged,
                                                                refunded_amount=original.refunded_amount + amount)
    return txn


def credit(*, user, amount: Decimal, idempotency_key: str, memo: str, source: str = "promotions",
           lease=None, order=None, project=None) -> LedgerTransaction:
    """Put platform money (promotions by default) into a buyer's wallet."""
    amount = _positive(amount)
    return ledger.post(kind="credit", memo=memo, idempotency_key=idempotency_key, lease=lease, order=order,
                       project=project, lines=[(key_of(user=None, kind=source), -amount),
                                               (key_of(user=user, kind="wallet"), amount)])


# --- Stripe ------------------------------------------------------------------------------------------------

def topup(*, user, amount: Decimal, intent_id: str) -> LedgerTransaction:
    """A succeeded Stripe PaymentIntent credits the wallet, once per intent."""
    amount = _positive(amount)
    return ledger.post(kind="topup", memo=f"top-up of {usd(amount)} via Stripe {intent_id}",
                       idempotency_key=f"stripe:pi:{intent_id}",
                       lines=[(CLEARING, -amount), (key_of(user=user, kind="wallet"), amount)])


def topup_refund(*, user, amount: Decimal, idempotency_key: str, memo: str,
                 spent_by_platform: Decimal = ZERO) -> LedgerTransaction:
    """Money going back to the buyer's card: out of the wallet, except `spent_by_platform` (a refund made
    outside the app of money already spent: the platform bears it)."""
    amount = _positive(amount)
    lines = [(CLEARING, amount), (key_of(user=user, kind="wallet"), -(amount - spent_by_platform))]
    if spent_by_platform:
        lines.append((PROMOTIONS, -spent_by_platform))
    return ledger.post(kind="refund", memo=memo, idempotency_key=idempotency_key,
                       lines=[line for line in lines if line[1]])


# --- resale and payouts --------------------------------------------------------------------------------------

def resale_sale(*, buyer, seller, amount: Decimal, idempotency_key: str, memo: str, order=None,
                buyer_project=None, seller_project=None) -> tuple[LedgerTransaction, Decimal]:
    """A resold window: the buyer's wallet pays, the seller's wallet gets it less the platform fee; each side's
    line is booked under its own project. Returns the transaction and the fee."""
    amount = _positive(amount)
    fee = fee_of(amount)
    txn = ledger.post(kind="resale", memo=memo, idempotency_key=idempotency_key, order=order,
                      project=buyer_project,
                      lines=_sale_lines(payer=key_of(user=buyer, kind="wallet"),
                                        payee=key_of(user=seller, kind="wallet"), amount=amount, fee=fee,
                                        payer_project=getattr(buyer_project, "pk", buyer_project),
                                        payee_project=getattr(seller_project, "pk", seller_project)))
    return txn, fee


def payout(*, provider, amount: Decimal, payout_id, memo: str) -> LedgerTransaction:
    """An approved payout leaves the provider's earnings for the payouts in flight; refused (nothing written)
    when the earnings hold less."""
    amount = _positive(amount)
    return ledger.post(kind="payout", memo=memo, idempotency_key=f"payout:{payout_id}",
                       lines=[(key_of(user=provider, kind="earnings"), -amount), (PAYOUTS, amount)])


def payout_sent(*, amount: Decimal, payout_id, memo: str) -> LedgerTransaction:
    """The payout's transfer left the platform's Stripe balance: it is no longer in flight."""
    amount = _positive(amount)
    return ledger.post(kind="payout_sent", memo=memo, idempotency_key=f"payout:{payout_id}:sent",
                       lines=[(PAYOUTS, -amount), (CLEARING, amount)])


def payout_return(*, provider, amount: Decimal, sent: bool, idempotency_key: str, memo: str) -> LedgerTransaction:
    """Payout money back in the provider's earnings: from the payouts in flight when its transfer failed, from
    Stripe when a sent transfer was reversed."""
    amount = _positive(amount)
    return ledger.post(kind="payout_return", memo=memo, idempotency_key=idempotency_key,
                       lines=[(CLEARING if sent else PAYOUTS, -amount),
                              (key_of(user=provider, kind="earnings"), amount)])
