"""The pure rules of log-in lock-out and fixed-window throttles: plain data in, plain data out, no database.

Lock-out: failures are counted from the first one of a window; the one that reaches the limit within
`window_seconds` of that first failure locks the account for `lock_seconds`. A failure after the window starts a
new count. While locked, attempts are refused before the password is checked and are not counted (a locked
account's lock does not grow with an attacker's tries; it ends `lock_seconds` after it began).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta


@dataclass(frozen=True)
class LockoutPolicy:
    failures: int = 5
    window_seconds: int = 900
    lock_seconds: int = 900

    @classmethod
    def from_settings(cls, accounts: dict) -> "LockoutPolicy":
        return cls(accounts["LOCKOUT_FAILURES"], accounts["LOCKOUT_WINDOW_SECONDS"], accounts["LOCKOUT_SECONDS"])


@dataclass(frozen=True)
class LockState:
    failures: int = 0
    failures_since: datetime | None = None
    locked_until: datetime | None = None

    def locked_at(self, now: datetime) -> bool:
        return self.locked_until is not None and now < self.locked_until


def after_failure(state: LockState, *, now: datetime, policy: LockoutPolicy) -> tuple[LockState, bool]:
    """The state after one more failed log-in at `now`, and whether this failure locked the account."""
    if state.locked_at(now):
        return state, False
    in_window = (state.failures_since is not None
                 and now - state.failures_since < timedelta(seconds=policy.window_seconds))
    failures = state.failures + 1 if in_window else 1
    since = state.failures_since if in_window else now
    if failures >= policy.failures:
        return LockState(0, None, now + timedelta(seconds=policy.lock_seconds)), True
    return replace(state, failures=failures, failures_since=since, locked_until=None), False


def after_success() -> LockState:
    """A log-in that passed every factor forgets the failures before it."""
    return LockState()


def wait_seconds(until: datetime, now: datetime) -> int:
    """Whole seconds until `until`, rounded up (never 0 while it is ahead: a Retry-After of 0 invites a retry)."""
    left = (until - now).total_seconds()
    return max(0, int(left) + (0 if left == int(left) else 1))


def window_of(now_seconds: float, period: int) -> tuple[int, int]:
    """The fixed window `now_seconds` (epoch seconds) falls in: its index and the seconds until it ends (≥ 1)."""
    index = int(now_seconds // period)
    return index, max(1, int((index + 1) * period - now_seconds + 0.999))


def in_words(seconds: int) -> str:
    """A wait as people say it: "40 seconds", "1 minute", "15 minutes", "2 hours"."""
    if seconds < 60:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    minutes = -(-seconds // 60)
    if minutes < 120:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    hours = -(-minutes // 60)
    return f"{hours} hours"
