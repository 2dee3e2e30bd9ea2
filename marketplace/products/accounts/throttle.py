"""Per-client-address throttles: failed log-ins, invalid API keys, sign-ups. Fixed windows counted in the shared
cache (Redis in production: one count for every web process; the demo's one process: its memory).

While Redis is away the cache fails open (config/cache.py): these throttles count nothing and let requests through,
with a warning in the log. An account's lock-out (policy.py, kept in the database) still holds then, so a password
guesser is still stopped after a few tries per account; only spraying many accounts from one address goes
unthrottled until Redis is back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

from .policy import window_of


@dataclass(frozen=True)
class AddressThrottle:
    kind: str  # "login", "api_key", "mail"
    limit: int
    period: int  # seconds

    def _key(self, address: str, index: int) -> str:
        return f"accounts-throttle:{self.kind}:{address}:{index}"

    def wait(self, *, address: str, now: float | None = None) -> int:
        """Seconds until `address` may try again (0: it may now)."""
        index, left = window_of(time.time() if now is None else now, self.period)
        return left if (cache.get(self._key(address, index)) or 0) >= self.limit else 0

    def hit(self, *, address: str, now: float | None = None) -> int:
        """Count one more for `address` in the current window; returns the count (0 while the cache is away)."""
        index, left = window_of(time.time() if now is None else now, self.period)
        key = self._key(address, index)
        # add() then an atomic increment: two web processes counting at once both count.
        cache.add(key, 0, timeout=left + 5)
        try:
            return cache.incr(key)
        except ValueError:  # the key expired between the two calls: a new window
            cache.set(key, 1, timeout=self.period + 5)
            return 1


def login_failures() -> AddressThrottle:
    a = settings.ACCOUNTS
    return AddressThrottle("login", a["ADDRESS_LOGIN_FAILURES"], a["ADDRESS_WINDOW_SECONDS"])


def api_key_failures() -> AddressThrottle:
    a = settings.ACCOUNTS
    return AddressThrottle("api_key", a["ADDRESS_API_KEY_FAILURES"], a["ADDRESS_WINDOW_SECONDS"])


def mails() -> AddressThrottle:
    """E-mails sent on request: sign-ups, confirmation links again, password resets."""
    return AddressThrottle("mail", settings.ACCOUNTS["ADDRESS_MAILS_PER_HOUR"], 3600)


def client_address(request) -> str:
    """The client's address as the API's throttles see it: X-Forwarded-For read through DJANGO_NUM_PROXIES
    trusted proxies (DRF's rule, so both count the same client), else the connection's address."""
    from rest_framework.throttling import BaseThrottle

    return (BaseThrottle().get_ident(request) or "unknown")[:64]


def scope_address(scope) -> str:
    """The client's address of a websocket handshake (ASGI scope), by the same rule as `client_address`."""
    from django.http import HttpRequest

    request = HttpRequest()
    request.META["REMOTE_ADDR"] = (scope.get("client") or ("unknown",))[0]
    for name, value in scope.get("headers", ()):
        if name == b"x-forwarded-for":
            request.META["HTTP_X_FORWARDED_FOR"] = value.decode("latin-1")
    return client_address(request)
