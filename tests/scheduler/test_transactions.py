"""A transaction PostgreSQL aborted to undo a deadlock is run again whole (scheduler/services/transactions.py):
recognised from the driver's SQLSTATE, retried only by the transaction's outermost caller, and, on PostgreSQL, two
transactions that lock two rows in opposite orders both end up committed."""
from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, close_old_connections, connection, transaction
from django.utils import timezone

from scheduler.models import Node
from scheduler.services.transactions import is_transient, retry_transient
from tests.factories import UserFactory, node_with_token


class _DriverError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


def _db_error(sqlstate: str) -> OperationalError:
    err = OperationalError(f"driver said {sqlstate}")
    err.__cause__ = _DriverError(sqlstate)
    return err


def _failing(times: int, sqlstate: str):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= times:
            raise _db_error(sqlstate)
        return "done"
    return fn, calls


def test_a_deadlock_or_serialization_failure_is_transient_and_other_database_errors_are_not():
    assert is_transient(_db_error("40P01")) and is_transient(_db_error("40001"))
    assert not is_transient(_db_error("08006"))  # connection failure: not the transaction's doing
    assert not is_transient(OperationalError("no cause"))
    assert not is_transient(ValueError("40P01"))


def test_a_transaction_aborted_by_deadlocks_is_run_again_until_it_commits():
    fn, calls = _failing(2, "40P01")
    assert retry_transient(fn, pause=0) == "done" and len(calls) == 3


def test_the_last_attempts_error_and_any_other_error_reach_the_caller_at_once():
    fn, calls = _failing(10, "40P01")
    with pytest.raises(OperationalError):
        retry_transient(fn, attempts=3, pause=0)
    assert len(calls) == 3
    fn, calls = _failing(1, "08006")
    with pytest.raises(OperationalError):
        retry_transient(fn, pause=0)
    assert len(calls) == 1


@pytest.mark.django_db
def test_inside_a_callers_transaction_the_error_is_the_callers():
    fn, calls = _failing(1, "40P01")
    with pytest.raises(OperationalError), transaction.atomic():
        retry_transient(fn, pause=0)
    assert len(calls) == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_transactions_locking_two_rows_in_opposite_orders_both_commit():
    provider = UserFactory()
    a, _ = node_with_token(provider=provider)
    b, _ = node_with_token(provider=provider)
    both_hold_one = threading.Barrier(2)
    attempts, failures = [], []

    def run(first, second, name):
        def once():
            attempts.append(name)
            with transaction.atomic():
                Node.objects.select_for_update().get(pk=first.pk)
                if attempts.count(name) == 1:
                    both_hold_one.wait(timeout=10)  # the first attempts each hold one row: a lock cycle follows
                Node.objects.select_for_update().get(pk=second.pk)
                Node.objects.filter(pk__in=[first.pk, second.pk]).update(last_heartbeat=timezone.now())
        try:
            retry_transient(once, pause=0.01)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=run, args=(a, b, "ab")), threading.Thread(target=run, args=(b, a, "ba"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert failures == []
    assert sorted(attempts) in (["ab", "ab", "ba"], ["ab", "ba", "ba"])  # PostgreSQL aborted one of them, once
