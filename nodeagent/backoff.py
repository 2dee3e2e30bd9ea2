"""Reconnect delays: exponential backoff with full jitter.

Full jitter (a uniform draw between 0 and the exponential ceiling) spreads a fleet of agents that all lost
the server at once, so they do not come back in one synchronised wave when it restarts.
"""
from __future__ import annotations

import random


# The longest wait: how long a node may stay dark after the server (or the Redis behind it) is back. 5 s keeps
# metrics on the consoles within 10 s of an outage's end, and still spreads 500 agents over 5 s (100 hellos/s).
CAP_SECONDS = 5.0


class Backoff:
    def __init__(self, *, base: float = 0.5, cap: float = CAP_SECONDS, rng: random.Random | None = None):
        if base <= 0 or cap < base:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base = base
        self.cap = cap
        self.attempt = 0
        self._rng = rng or random.Random()

    def ceiling(self) -> float:
        return min(self.cap, self.base * (2 ** self.attempt))

    def next_delay(self) -> float:
        """Seconds to wait before the next attempt; each call raises the ceiling until the cap."""
        delay = self._rng.uniform(0.0, self.ceiling())
        self.attempt = min(self.attempt + 1, 32)  # 2**32 * base passes any sane cap: no overflow games
        return delay

    def reset(self) -> None:
        """After a successful handshake: the next outage starts from the base again."""
        self.attempt = 0
