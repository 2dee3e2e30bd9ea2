"""The double-entry ledger: every movement of money is one balanced LedgerTransaction.

Sign convention: an entry's amount is what it adds to its account's balance. Entries of one transaction
sum to exactly zero. Buyer money: wallet (user). Provider money: earnings (user). Platform accounts
(user=None): platform_fees, stripe_clearing (money in from / out to Stripe; goes negative as buyers top
up), promotions (platform-funded credits; goes negative as credits are granted). User accounts never go
below zero unless the caller names them in `allow_negative`.

Amounts are Decimal micro-dollars (6 places). A float is refused, and so is an amount with more than six
decimal places: rounding here would silently create or destroy money, so callers round (see `fee_for`).
"""
from __future__ import annotations

import uuid
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db import IntegrityError, transaction

from marketplace.models import Account, LedgerEntry, LedgerTransaction, Project
from scheduler.errors import Conflict, DomainError

MICRO = Decimal("0.000001")
CENT = Decimal("0.01")
PLATFORM_KINDS = (Account.Kind.PLATFORM_FEES, Account.Kind.STRIPE_CLEARING, Account.Kind.PROMOTIONS)
_ALIASES = {"credits": Account.Kind.PROMOTIONS, "fees": Account.Kind.PLATFORM_FEES}


class InsufficientFunds(DomainError):
    status = 402

    def __init__(self, message: str = "Not enough money in the wallet.", **kw):
        super().__init__(message, code=kw.pop("code", "insufficient_funds"), **kw)


def money(value, *, field: str = "amount") -> Decimal:
    """`value` as an exact micro-dollar Decimal; refuses floats, NaN/inf and sub-micro precision."""
    if isinstance(value, float) or isinstance(value, bool):
        raise TypeError(f"{field}: money is Decimal or str, never float or bool ({value!r})")
    try:
        d = Decimal(value) if not isinstance(value, Decimal) else value
    except Exception:  # decimal.InvalidOperation and friends
        raise DomainError(f"{field} is not a number", field=field) from None
    if not d.is_finite():
        raise DomainError(f"{field} must be a finite number", field=field)
    q = d.quantize(MICRO)
    if q != d:
        raise DomainError(f"{field} has more than six decimal places", field=field)
    return q


def fee_for(*, amount: Decimal, fee_rate: Decimal) -> Decimal:
    """The platform fee on `amount`, rounded half-up to a micro-dollar and never more than `amount`."""
    return min(amount, (money(amount) * Decimal(fee_rate)).quantize(MICRO, rounding=ROUND_HALF_UP))


def _kind(kind: str) -> str:
    return _ALIASES.get(kind, kind)


def account_for(*, user, kind: str) -> Account:
    """The (user, kind) account, created on first use; user=None means a platform account."""
    kind = _kind(kind)
    if kind not in Account.Kind.values:
        raise DomainError(f"unknown account kind {kind!r}", field="kind")
    if (user is None) != (kind in PLATFORM_KINDS):
        raise DomainError(f"a {kind} account {'belongs to the platform' if user is None else 'needs a user'}")
    # get_or_create retries the get after an IntegrityError, so two first uses at once end with one row.
    with transaction.atomic():
        account, _ = Account.objects.get_or_create(user=user, kind=kind)
    return account


def platform_account(kind: str) -> Account:
    """The platform's account of `kind` (platform_fees, stripe_clearing, promotions/credits)."""
    return account_for(user=None, kind=kind)


def _uuid_of(obj) -> uuid.UUID | None:
    if obj is None:
        return None
    return obj if isinstance(obj, uuid.UUID) else getattr(obj, "pk", None) or uuid.UUID(str(obj))


def post(*, kind: str, memo: str, lines: list[tuple[Account, Decimal]], idempotency_key: str | None = None,
         lease=None, order=None, project: Project | None = None,
         allow_negative: tuple[Account, ...] = ()) -> LedgerTransaction:
    """Write one balanced transaction atomically, or nothing; a known idempotency key returns its transaction."""
    if not kind or len(kind) > 32:
        raise DomainError("a transaction needs a kind of 1 to 32 characters", field="kind")
    deltas: dict[int, Decimal] = defaultdict(Decimal)
    entries: list[tuple[int, Decimal]] = []
    for account, amount in lines:
        amount = money(amount)
        if amount:
            entries.append((account.pk, amount))
            deltas[account.pk] += amount
    if not entries:
        raise DomainError("a transaction needs at least one non-zero line")
    total = sum((a for _, a in entries), Decimal("0"))
    if total != 0:
        raise DomainError(f"unbalanced transaction: lines sum to {total}, not 0", code="unbalanced")
    if idempotency_key is not None and not (0 < len(idempotency_key) <= 200):
        raise DomainError("an idempotency key has 1 to 200 characters", field="idempotency_key")
    may_go_negative = {a.pk for a in allow_negative}
    with transaction.atomic():
        # Lock every touched account in pk order: two transfers over the same accounts then queue instead of
        # deadlocking, and the balance checked below cannot change before our update (no double spend).
        locked = {a.pk: a for a in Account.objects.select_for_update().filter(pk__in=deltas).order_by("pk")}
        if len(locked) != len(deltas):
            raise DomainError("a line names an account that does not exist")
        if idempotency_key is not None:
            # Checked under the locks: a concurrent poster with the same key and accounts has committed by now.
            existing = LedgerTransaction.objects.filter(idempotency_key=idempotency_key).first()
            if existing is not None:
                return _same_or_conflict(existing, kind)
        for pk, delta in deltas.items():
            account = locked[pk]
            new_balance = account.balance + delta
            if new_balance < 0 and account.user_id is not None and pk not in may_go_negative:
                error = InsufficientFunds if account.kind == Account.Kind.WALLET else DomainError
                raise error(f"Not enough money in the {account.get_kind_display()}: balance {account.balance:.2f}"
                            f" USD, needs {-delta:.2f} USD.", details={
                                "account": account.kind, "balance": str(account.balance), "needed": str(-delta)})
        try:
            with transaction.atomic():  # a savepoint, so a lost key race leaves the outer transaction usable
                txn = LedgerTransaction.objects.create(kind=kind, memo=memo[:400], idempotency_key=idempotency_key,
                                                       lease_id=_uuid_of(lease), order_id=_uuid_of(order),
                                                       project=project)
        except IntegrityError:
            existing = LedgerTransaction.objects.filter(idempotency_key=idempotency_key).first()
            if existing is None:
                raise
            return _same_or_conflict(existing, kind)
        LedgerEntry.objects.bulk_create([LedgerEntry(transaction=txn, account_id=pk, amount=a) for pk, a in entries])
        for pk, delta in deltas.items():
            if delta:  # exact Decimal arithmetic on the locked row (SQLite would add NUMERICs as floats)
                Account.objects.filter(pk=pk).update(balance=locked[pk].balance + delta)
    return txn


def _same_or_conflict(existing: LedgerTransaction, kind: str) -> LedgerTransaction:
    if existing.kind != kind:
        raise Conflict(f"idempotency key already used by a {existing.kind} transaction", code="idempotency_conflict")
    return existing


def balance(*, account: Account) -> Decimal:
    """The account's current (cached, ledger-checked) balance."""
    return Account.objects.values_list("balance", flat=True).get(pk=account.pk)


def wallet_balance(*, user) -> Decimal:
    """A buyer's wallet balance (zero before its first top-up)."""
    value = Account.objects.filter(user=user, kind=Account.Kind.WALLET).values_list("balance", flat=True).first()
    return value if value is not None else Decimal("0").quantize(MICRO)


def charge(*, buyer, provider, amount: Decimal, idempotency_key: str, kind: str = "usage",
           fee_rate: Decimal | None = None, memo: str = "", lease=None, order=None,
           project: Project | None = None) -> LedgerTransaction:
    """Move `amount` from the buyer's wallet: the provider's earnings get it minus the platform fee."""
    amount = money(amount)
    if amount <= 0:
        raise DomainError("a charge is a positive amount", field="amount")
    fee = fee_for(amount=amount, fee_rate=settings.PLATFORM_FEE_RATE if fee_rate is None else fee_rate)
    return post(kind=kind, memo=memo or f"{kind} {amount} USD", idempotency_key=idempotency_key,
                lease=lease, order=order, project=project,
                lines=[(account_for(user=buyer, kind="wallet"), -amount),
                       (account_for(user=provider, kind="earnings"), amount - fee),
                       (platform_account("platform_fees"), fee)])


def charge_usage(*, buyer, provider, amount: Decimal, fee_rate: Decimal | None = None, lease=None, order=None,
                 project: Project | None = None, idempotency_key: str, memo: str = "") -> LedgerTransaction:
    """Charge metered usage (see `charge`)."""
    return charge(buyer=buyer, provider=provider, amount=amount, fee_rate=fee_rate, lease=lease, order=order,
                  project=project, idempotency_key=idempotency_key, kind="usage", memo=memo)


def reverse(*, original: LedgerTransaction, idempotency_key: str, memo: str = "",
            fraction: Decimal = Decimal("1")) -> LedgerTransaction:
    """Post the mirror image of `original` (or `fraction` of it, e.g. a partial refund of a booking)."""
    fraction = Decimal(fraction)
    if not (0 < fraction <= 1):
        raise DomainError("a reversal covers a fraction in (0, 1]", field="fraction")
    rows = list(original.entries.select_related("account").order_by("pk"))
    lines = [(e.account, -(e.amount * fraction).quantize(MICRO, rounding=ROUND_HALF_UP)) for e in rows]
    # Rounding each line may leave a micro-dollar over: the platform line (if any) absorbs it.
    rest = -sum((a for _, a in lines), Decimal("0"))
    if rest:
        i = next((i for i, (acc, _) in enumerate(lines) if acc.user_id is None), len(lines) - 1)
        lines[i] = (lines[i][0], lines[i][1] + rest)
    return post(kind="reversal", memo=memo or f"reversal of {original.kind} {original.pk}", lines=lines,
                idempotency_key=idempotency_key, lease=original.lease_id, order=original.order_id,
                project=original.project)


def refundable(*, original: LedgerTransaction) -> tuple[Decimal, Decimal]:
    """(what the wallet was charged by `original`, what is left to refund of it)."""
    charged = -sum(original.entries.filter(amount__lt=0, account__kind=Account.Kind.WALLET)
                   .values_list("amount", flat=True), Decimal("0"))
    return charged, charged - original.refunded_amount


def refund(*, original: LedgerTransaction, idempotency_key: str, memo: str = "",
           amount: Decimal | None = None) -> LedgerTransaction:
    """Give the buyer back `amount` (default all that is left) of a charge, taken pro rata from provider and
    platform fee. Refunds of one charge never add up to more than it charged; a known key returns its refund."""
    with transaction.atomic():
        # Lock the charge: the race is two refunds of it under different keys (a failed provision and an
        # operator, say) both reading the same amount left and together giving back more than was paid.
        original = LedgerTransaction.objects.select_for_update().get(pk=original.pk)
        existing = LedgerTransaction.objects.filter(idempotency_key=idempotency_key).first() \
            if idempotency_key else None
        if existing is not None:
            return _same_or_conflict(existing, "reversal")
        charged, left = refundable(original=original)
        if not charged:
            raise DomainError("only a charge to a wallet can be refunded")
        amount = left if amount is None else money(amount)
        if not (0 < amount <= left):
            raise DomainError(f"a refund is between 0 and the {left} USD left of the charged {charged} USD",
                              field="amount", code="refund_exceeds_charge",
                              details={"charged": str(charged), "refunded": str(original.refunded_amount)})
        txn = reverse(original=original, idempotency_key=idempotency_key, memo=memo or f"refund of {original.kind}",
                      fraction=amount / charged)
        LedgerTransaction.objects.filter(pk=original.pk).update(charged_amount=charged,
                                                                refunded_amount=original.refunded_amount + amount)
    return txn


def credit(*, user, amount: Decimal, idempotency_key: str, memo: str, source: str = "promotions",
           lease=None, order=None, project: Project | None = None) -> LedgerTransaction:
    """Put platform money (promotions by default) into a buyer's wallet, e.g. spot-notice compensation."""
    amount = money(amount)
    if amount <= 0:
        raise DomainError("a credit is a positive amount", field="amount")
    return post(kind="credit", memo=memo, idempotency_key=idempotency_key, lease=lease, order=order, project=project,
                lines=[(platform_account(source), -amount), (account_for(user=user, kind="wallet"), amount)])


def ledger_check() -> list[str]:
    """Every inconsistency in the ledger as a sentence; empty when each balance equals its entries' sum."""
    # Summed in Python with exact Decimals: SQLite's SUM over NUMERIC columns goes through floats.
    by_account: dict[int, Decimal] = defaultdict(Decimal)
    by_transaction: dict = defaultdict(Decimal)
    for account_id, transaction_id, amount in LedgerEntry.objects.values_list(
            "account_id", "transaction_id", "amount").iterator(chunk_size=5000):
        by_account[account_id] += amount
        by_transaction[transaction_id] += amount
    problems = []
    for account in Account.objects.all():
        if account.balance != by_account.get(account.pk, Decimal("0")):
            problems.append(f"{account}: balance {account.balance} != entries {by_account.get(account.pk, 0)}")
        if account.user_id is not None and account.balance < 0:
            problems.append(f"{account}: negative balance {account.balance}")
    problems += [f"transaction {pk} sums to {s}" for pk, s in by_transaction.items() if s != 0]
    return problems
