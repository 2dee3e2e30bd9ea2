"""Per-socket limits on what an agent sends: token buckets in memory, no I/O, a few float operations.

A healthy agent sends one metrics frame per interval and rarely an event; a broken or hostile one could
flood the gateway, the ingest buffer and every console subscriber. Each socket gets its own buckets
(a node has one socket: see the 4409 rule), refilled at `rate` frames per second up to `burst`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    rate: float  # tokens added per second
    burst: float  # the most tokens held (frames that may arrive back to back)
    tokens: float = -1.0
    last: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def take(self, now: float | None = None) -> bool:
        """Spend one token if there is one; False means the frame is over the limit."""
        now = time.monotonic() if now is None else now
        tokens = self.tokens + (now - self.last) * self.rate
        self.last = now
        if tokens > self.burst:
            tokens = self.burst
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return True
        self.tokens = tokens
        return False


@dataclass
class DropWindow:
    """Frames dropped over the limits in the last `window` seconds (a fixed window, reset when it passes);
    more than `max_dropped` of them is persistent abuse."""

    window: float
    max_dropped: int
    dropped: int = 0
    since: float = field(default_factory=time.monotonic)

    def drop(self, now: float | None = None) -> bool:
        """Count one dropped frame; True when the socket should be closed."""
        now = time.monotonic() if now is None else now
        if now - self.since > self.window:
            self.since, self.dropped = now, 0
        self.dropped += 1
        return self.dropped > self.max_dropped
