"""The pure rules of lock-out and throttle windows (no database)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from marketplace.products.accounts.policy import (LockoutPolicy, LockState, after_failure, in_words, wait_seconds,
                                                  window_of)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
POLICY = LockoutPolicy(failures=5, window_seconds=900, lock_seconds=900)


def fail_at(state, *seconds):
    locks = []
    for s in seconds:
        state, locked = after_failure(state, now=T0 + timedelta(seconds=s), policy=POLICY)
        locks.append(locked)
    return state, locks


def test_the_fifth_failure_within_the_window_locks_the_account_for_the_lock_time():
    state, locks = fail_at(LockState(), 0, 10, 20, 30, 40)
    assert locks == [False, False, False, False, True]
    assert state.locked_until == T0 + timedelta(seconds=40 + 900)
    assert state.locked_at(T0 + timedelta(seconds=939)) and not state.locked_at(T0 + timedelta(seconds=940))


def test_failures_spread_wider_than_the_window_never_lock():
    # One every 4 minutes: the count starts again once the first failure of a window is 15 minutes old.
    state, locks = fail_at(LockState(), 0, 240, 480, 720, 960, 1200, 1440, 1680)
    assert not any(locks) and state.locked_until is None and state.failures == 4


def test_failures_while_locked_do_not_extend_the_lock_or_count():
    state, _ = fail_at(LockState(), 0, 1, 2, 3, 4)
    until = state.locked_until
    state, locks = fail_at(state, 5, 100, 800)
    assert locks == [False, False, False] and state.locked_until == until


def test_after_the_lock_a_new_count_starts():
    state, _ = fail_at(LockState(), 0, 1, 2, 3, 4)
    state, locks = fail_at(state, 905)
    assert state.failures == 1 and not locks[0] and not state.locked_at(T0 + timedelta(seconds=905))


@pytest.mark.parametrize("seconds, words", [(1, "1 second"), (40, "40 seconds"), (60, "1 minute"),
                                            (61, "2 minutes"), (900, "15 minutes"), (7200, "2 hours")])
def test_waits_are_said_in_words(seconds, words):
    assert in_words(seconds) == words


def test_a_wait_rounds_up_and_a_window_ends_at_its_boundary():
    assert wait_seconds(T0 + timedelta(seconds=0.2), T0) == 1
    assert wait_seconds(T0, T0 + timedelta(seconds=3)) == 0
    assert window_of(1000.0, 600) == (1, 200)
    assert window_of(1199.5, 600) == (1, 1)
    assert window_of(1200.0, 600) == (2, 600)
