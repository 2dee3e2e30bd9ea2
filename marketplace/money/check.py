"""Reconciling the ledger: every account's balance equals the sum of its entries, every transaction sums to
zero, no user account is negative. Beat runs `ledger_check_run` every LEDGER_CHECK_SECONDS in production;
a miss is logged as an error and shown to operators in the admin (Ledger checks)."""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from decimal import Decimal

from django.db import connection
from django.db.models import Sum

from marketplace.amounts import ZERO
from marketplace.models import Account, LedgerCheck, LedgerEntry

log = logging.getLogger(__name__)


def ledger_check() -> list[str]:
    """Every inconsistency in the ledger as a sentence; empty when each balance equals its entries' sum."""
    if connection.vendor == "postgresql":  # NUMERIC sums are exact in the database
        by_account = dict(LedgerEntry.objects.order_by().values("account_id").annotate(s=Sum("amount"))
                          .values_list("account_id", "s"))
        unbalanced = list(LedgerEntry.objects.order_by().values("transaction_id").annotate(s=Sum("amount"))
                          .exclude(s=0).values_list("transaction_id", "s"))
    else:  # SQLite's SUM over NUMERIC goes through floats: add exact Decimals here
        by_account = defaultdict(Decimal)
        by_transaction: dict = defaultdict(Decimal)
        for account_id, transaction_id, amount in LedgerEntry.objects.values_list(
                "account_id", "transaction_id", "amount").iterator(chunk_size=5000):
            by_account[account_id] += amount
            by_transaction[transaction_id] += amount
        unbalanced = [(pk, s) for pk, s in by_transaction.items() if s != 0]
    problems = []
    for account in Account.objects.all():
        entries = by_account.get(account.pk, ZERO)
        if account.balance != entries:
            problems.append(f"{account}: balance {account.balance} != entries {entries}")
        if account.user_id is not None and account.balance < 0:
            problems.append(f"{account}: negative balance {account.balance}")
    problems += [f"transaction {pk} sums to {s}" for pk, s in unbalanced]
    return problems


def ledger_check_run() -> LedgerCheck:
    """Check the ledger now and keep the result (the admin lists them); a problem is logged as an error."""
    t0 = time.perf_counter()
    problems = ledger_check()
    check = LedgerCheck.objects.create(ok=not problems, problems=problems[:500], accounts=Account.objects.count(),
                                       entries=LedgerEntry.objects.count(), seconds=time.perf_counter() - t0)
    if problems:
        log.error("ledger check found %d problems, first: %s", len(problems), problems[0])
    else:
        log.info("ledger check: %d accounts, %d entries balance (%.2f s)", check.accounts, check.entries,
                 check.seconds)
    return check
