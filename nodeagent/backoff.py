"""Reconnect delays: exponential backoff with full jitter.

Full jitter (a uniform draw between 0 and the exponential ceiling) spreads a fleet of agents that all lost
the server at once, so they do not come back in one synchronised wave when it restarts.
"""
from __future__ import annotations

import random


class Backoff:
    def __init__(self, *, base: float = 0.5, cap: float = 30.0, rng: random.Random | None = None):
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
