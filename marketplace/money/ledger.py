"""The ledger writer: every movement of money is one balanced LedgerTransaction, written here and nowhere else.

Sign convention: an entry's amount is what it adds to its account's balance. Entries of one transaction
sum to exactly zero. Buyer money: wallet (user). Provider money: earnings (user). Platform accounts
(user=None): platform_fees, stripe_clearing (money in from / out to Stripe; goes negative as buyers top
up), promotions (platform-funded credits; goes negative as credits are granted), payouts_clearing (approved
payouts on their way to a provider's bank). User accounts never go
below zero unless a posting names them in `allow_negative`.

Amounts are Decimal micro-dollars (amounts.money refuses floats and sub-micro precision). Each line may name
the project it belongs to (a resale moves money between two users' projects in one transaction); by default
it is the transaction's. Named movements (charges, refunds, top-ups, ...) are built in movements.py.

`post_many` writes a batch in a constant number of statements (metering posts thousands of lease-minutes at
once): accounts resolved through a process cache of ids and locked in one statement in pk order, known
idempotency keys looked up in one, then one insert each for transactions and entries and one update of the
balances.
"""
from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Iterable, Union

from django.db import IntegrityError, transaction
from django.utils import timezone

from marketplace.amounts import ZERO, money, usd
from marketplace.models import Account, LedgerEntry, LedgerTransaction, Project
from marketplace.models.sql import insert_rows, update_rows
from scheduler.errors import Conflict, DomainError

# Plain strings: a key is hashed for every line of a batch (an enum member hashes in Python, a str in C).
PLATFORM_KINDS = frozenset(str(k) for k in (Account.Kind.PLATFORM_FEES, Account.Kind.STRIPE_CLEARING,
                                            Account.Kind.PROMOTIONS, Account.Kind.PAYOUTS_CLEARING))
KINDS = frozenset(str(k) for k in Account.Kind.values)
_ALIASES = {"credits": str(Account.Kind.PROMOTIONS), "fees": str(Account.Kind.PLATFORM_FEES)}

AccountKey = tuple  # (user id or None, kind)
TXN_COLUMNS = ["id", "kind", "memo", "idempotency_key", "lease_id", "order_id", "project", "refunded_amount",
               "created_at"]
ENTRY_COLUMNS = ["transaction", "account", "amount", "project", "created_at"]
AccountRef = Union[Account, AccountKey]


class InsufficientFunds(DomainError):
    status = 402

    def __init__(self, message: str = "Not enough money in the wallet.", **kw):
        super().__init__(message, code=kw.pop("code", "insufficient_funds"), **kw)


def _kind(kind: str) -> str:
    kind = str(kind)
    return _ALIASES.get(kind, kind)


def key_of(*, user, kind: str) -> AccountKey:
    """The (user id, kind) key of an account; user None (or a platform kind) = the platform's account."""
    kind = _kind(kind)
    if kind not in KINDS:
        raise DomainError(f"unknown account kind {kind!r}", field="kind")
    user_id = getattr(user, "pk", user)
    if (user_id is None) != (kind in PLATFORM_KINDS):
        raise DomainError(f"a {kind} account {'belongs to the platform' if user_id is None else 'needs a user'}")
    return (user_id, kind)


# (user id, kind) -> account pk, remembered once the transaction that found or made the row has committed: an
# id handed out before could be of a row another writer cannot see yet, or one a rollback takes away. Accounts
# are never deleted; a test database that is flushed clears it (apps.py). Every lock checks the rows it gets
# against their keys anyway and resolves again on a miss (locked_balances).
_ids: dict[AccountKey, int] = {}


def forget_account_ids(**kwargs) -> None:
    _ids.clear()


def _resolve(keys: Iterable[AccountKey], *, fresh: bool = False) -> dict[AccountKey, int]:
    keys = set(keys)
    known = {} if fresh else {k: _ids[k] for k in keys if k in _ids}
    missing = [k for k in keys if k not in known]
    if not missing:
        return known
    found = _existing(missing)
    for user_id, kind in [k for k in missing if k not in found]:
        # get_or_create retries the get after an IntegrityError: two first uses at once end with one row.
        with transaction.atomic():
            account, _ = Account.objects.get_or_create(user_id=user_id, kind=kind)
        found[(user_id, kind)] = account.pk
    transaction.on_commit(lambda: _ids.update(found))
    return {**known, **found}


def _existing(keys: list[AccountKey]) -> dict[AccountKey, int]:
    from django.db.models import Q

    q = Q()
    for user_id, kind in keys:
        q |= Q(user_id=user_id, kind=kind) if user_id is not None else Q(user__isnull=True, kind=kind)
    return {(u, k): pk for pk, u, k in Account.objects.filter(q).values_list("pk", "user_id", "kind")}


def account_for(*, user, kind: str) -> Account:
    """The (user, kind) account, created on first use; user=None means a platform account."""
    key = key_of(user=user, kind=kind)
    pk = _resolve([key])[key]
    account = Account.objects.filter(pk=pk).first()
    if account is None or (account.user_id, account.kind) != key:
        account = Account.objects.get(pk=_resolve([key], fresh=True)[key])
    return account


def platform_account(kind: str) -> Account:
    """The platform's account of `kind` (platform_fees, stripe_clearing, promotions/credits)."""
    return account_for(user=None, kind=kind)


def _key(ref: AccountRef) -> AccountKey:
    if isinstance(ref, Account):
        return (ref.user_id, ref.kind)
    return key_of(user=ref[0], kind=ref[1])


@dataclass
class Posting:
    """One balanced transaction to write. `lines` are (account, amount), booked under the posting's project,
    or (account, amount, project id) naming the line's own (None: no project); an account is an Account or a
    (user, kind) key."""

    kind: str
    memo: str
    lines: list
    idempotency_key: str | None = None
    lease_id: uuid.UUID | None = None
    order_id: uuid.UUID | None = None
    project_id: int | None = None
    allow_negative: tuple = ()  # accounts (as above) that may go below zero
    id: uuid.UUID = field(default_factory=uuid.uuid4)

    def deltas(self) -> list[tuple[AccountKey, Decimal, int | None]]:
        out = []
        for line in self.lines:
            ref, amount = line[0], line[1]
            project = line[2] if len(line) > 2 else self.project_id
            amount = money(amount)
            if amount:
                out.append((_key(ref), amount, project))
        return out


def _check(p: Posting, deltas) -> None:
    if not p.kind or len(p.kind) > 32:
        raise DomainError("a transaction needs a kind of 1 to 32 characters", field="kind")
    if not deltas:
        raise DomainError("a transaction needs at least one non-zero line")
    total = sum((a for _, a, _ in deltas), ZERO)
    if total != 0:
        raise DomainError(f"unbalanced transaction: lines sum to {total}, not 0", code="unbalanced")
    if p.idempotency_key is not None and not (0 < len(p.idempotency_key) <= 200):
        raise DomainError("an idempotency key has 1 to 200 characters", field="idempotency_key")


def locked_balances(keys: Iterable[AccountKey]) -> dict[AccountKey, tuple[int, Decimal]]:
    """Lock the accounts of `keys` (created on first use) in pk order and return {key: (pk, balance)}.
    Two writers over the same accounts then queue instead of deadlocking, and a balance read here cannot
    change before the holder's transaction ends (no double spend). Call inside a transaction."""
    keys = set(keys)
    for attempt in (0, 1):
        ids = _resolve(keys, fresh=attempt == 1)
        try:
            # A savepoint: when a remembered id turns out stale, the locks taken are given back before the
            # ids are resolved again (which may wait for another writer's first use of an account).
            with transaction.atomic():
                rows = {pk: (u, k, b) for pk, u, k, b in Account.objects.select_for_update().filter(
                    pk__in=set(ids.values())).order_by("pk").values_list("pk", "user_id", "kind", "balance")}
                if not all(pk in rows and rows[pk][:2] == key for key, pk in ids.items()):
                    raise _StaleIds()
        except _StaleIds:
            continue
        return {key: (pk, rows[pk][2]) for key, pk in ids.items()}
    raise DomainError("a line names an account that does not exist")


class _StaleIds(Exception):
    pass


def post_many(postings: list[Posting]) -> list[LedgerTransaction]:
    """Write `postings` atomically, all or none, in a constant number of statements. A posting whose
    idempotency key is known returns the transaction written with it (of the same kind, else Conflict)."""
    planned = [(p, p.deltas()) for p in postings]
    for p, deltas in planned:
        _check(p, deltas)
    keys = [p.idempotency_key for p in postings if p.idempotency_key is not None]
    if len(set(keys)) != len(keys):
        raise DomainError("two postings of one batch share an idempotency key", field="idempotency_key")
    with transaction.atomic():
        accounts = locked_balances({k for _, deltas in planned for k, _, _ in deltas})
        # Checked under the locks: a concurrent poster with the same key and accounts has committed by now.
        known = {t.idempotency_key: t for t in LedgerTransaction.objects.filter(idempotency_key__in=keys)} \
            if keys else {}
        balance = {k: b for k, (_, b) in accounts.items()}
        now = timezone.now()
        out: list[LedgerTransaction | None] = []
        rows, entries = [], []
        for p, deltas in planned:
            if p.idempotency_key in known:
                out.append(_same_or_conflict(known[p.idempotency_key], p.kind))
                continue
            negative_ok = {_key(a) for a in p.allow_negative}
            per_account: dict[AccountKey, Decimal] = defaultdict(Decimal)
            for k, a, _ in deltas:
                per_account[k] += a
            for k, delta in per_account.items():
                new = balance[k] + delta
                if new < 0 and k[0] is not None and k not in negative_ok:
                    error = InsufficientFunds if k[1] == Account.Kind.WALLET else DomainError
                    label = Account.Kind(k[1]).label
                    raise error(f"Not enough money in the {label}: it holds {usd(balance[k])}, this needs "
                                f"{usd(-delta)}.", details={"account": k[1], "balance": str(balance[k]),
                                                               "needed": str(-delta)})
                balance[k] = new
            txn = LedgerTransaction(id=p.id, kind=p.kind, memo=p.memo[:400], idempotency_key=p.idempotency_key,
                                    lease_id=p.lease_id, order_id=p.order_id, project_id=p.project_id, created_at=now)
            rows.append(txn)
            out.append(txn)
            entries += [(p.id, accounts[k][0], a, project, now) for k, a, project in deltas]
        if rows:
            try:
                with transaction.atomic():  # a savepoint, so a lost key race leaves the outer transaction usable
                    insert_rows(LedgerTransaction, TXN_COLUMNS, [
                        (t.id, t.kind, t.memo, t.idempotency_key, t.lease_id, t.order_id, t.project_id,
                         ZERO, now) for t in rows])
            except IntegrityError:
                # A concurrent poster without our accounts in common used a key of ours first.
                if len(rows) == 1 and rows[0].idempotency_key is not None:
                    existing = LedgerTransaction.objects.filter(idempotency_key=rows[0].idempotency_key).first()
                    if existing is not None:
                        return [_same_or_conflict(existing, rows[0].kind)]
                raise
            insert_rows(LedgerEntry, ENTRY_COLUMNS, entries)
            # Exact Decimal arithmetic done here on the locked rows (SQLite would add NUMERICs as floats).
            update_rows(Account, ["balance"], [(pk, balance[k]) for k, (pk, old) in accounts.items()
                                               if balance[k] != old])
    return out  # type: ignore[return-value]


def post(*, kind: str, memo: str, lines: list, idempotency_key: str | None = None, lease=None, order=None,
         project: Project | int | None = None, allow_negative: tuple = ()) -> LedgerTransaction:
    """Write one balanced transaction atomically, or nothing; a known idempotency key returns its transaction."""
    return post_many([Posting(kind=kind, memo=memo, lines=lines, idempotency_key=idempotency_key,
                              lease_id=_uuid_of(lease), order_id=_uuid_of(order),
                              project_id=getattr(project, "pk", project), allow_negative=allow_negative)])[0]


def _uuid_of(obj) -> uuid.UUID | None:
    if obj is None:
        return None
    return obj if isinstance(obj, uuid.UUID) else getattr(obj, "pk", None) or uuid.UUID(str(obj))


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
    return value if value is not None else ZERO.quantize(Decimal("0.000001"))


def wallet_balances(user_ids: Iterable) -> dict:
    """Wallet balances of many buyers in one query (missing: no wallet yet, i.e. zero)."""
    return dict(Account.objects.filter(user_id__in=list(user_ids), kind=Account.Kind.WALLET)
                .values_list("user_id", "balance"))
