"""A transaction PostgreSQL broke off to undo a deadlock or a serialization conflict is retried whole.

PostgreSQL resolves a lock cycle by aborting one of its transactions (SQLSTATE 40P01), and a serializable
conflict likewise (40001): nothing of it was written, and the same transaction a moment later normally goes
through. Only a transaction's outermost caller can run it again, so inside a caller's transaction the error is
the caller's."""
from __future__ import annotations

import functools
import random
import time
from typing import Callable, TypeVar

from django.db import OperationalError, connection

T = TypeVar("T")
TRANSIENT_SQLSTATES = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure
ATTEMPTS = 4


def is_transient(exc: BaseException) -> bool:
    """A database error that says: run the whole transaction again."""
    return isinstance(exc, OperationalError) and getattr(exc.__cause__, "sqlstate", None) in TRANSIENT_SQLSTATES


def retry_transient(fn: Callable[[], T], *, attempts: int = ATTEMPTS, pause: float = 0.05) -> T:
    """fn() (which opens its own transaction), again after a short jittered pause while the database aborted it
    to undo a deadlock or a serialization conflict; the last attempt's error goes to the caller."""
    if connection.in_atomic_block:
        return fn()
    for attempt in range(attempts):
        try:
            return fn()
        except OperationalError as exc:
            if attempt == attempts - 1 or not is_transient(exc):
                raise
        time.sleep(pause * 2 ** attempt * (0.5 + random.random()))
    raise AssertionError("unreachable")


def transient_retried(fn: Callable[..., T]) -> Callable[..., T]:
    """fn, each call run by retry_transient: for a function that opens its own transaction, called from outside one
    (the gateway's database calls, a beat task's step)."""
    @functools.wraps(fn)
    def call(*args, **kwargs) -> T:
        return retry_transient(lambda: fn(*args, **kwargs))
    return call
