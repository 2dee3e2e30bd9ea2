"""The shared cache of production (REDIS_URL): Django's Redis backend, failing open while Redis is away.

The API's throttles and the per-address log-in and API-key throttles (marketplace/products/accounts/throttle.py)
use the cache; an account's lock-out is kept in the database and holds while Redis is away. A Redis restart must not turn every API request into a 500: during it a
read finds nothing and a write is dropped (throttles let requests through for those seconds), with one warning.

One client, and so one connection pool, per process and Redis: Django keeps a cache object per thread, and ASGI
runs each request's sync code in a thread of its own, so Django's backend made a pool and a new TCP connection to
Redis (with its handshake) for every API request, and dropped it after.
"""
from __future__ import annotations

import logging
import threading
import time

from django.core.cache.backends.redis import RedisCache
from django.utils.functional import cached_property
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
WARN_EVERY_SECONDS = 30.0


_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


class FailOpenRedisCache(RedisCache):
    _warned_at = float("-inf")

    @cached_property
    def _cache(self):
        """The process's client for these servers and options (redis-py's pools are thread-safe and start afresh in a
        forked child)."""
        key = (self._class, tuple(self._servers), repr(sorted(self._options.items())))
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = self._class(self._servers, **self._options)
        return client

    def _unreachable(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_SECONDS:
            self._warned_at = now
            log.warning("the cache (Redis) is unreachable, throttles are not counted meanwhile: %s", exc)

    def get(self, key, default=None, version=None):
        try:
            return super().get(key, default, version)
        except _UNREACHABLE as exc:
            self._unreachable(exc)
            return default

    def set(self, key, value, timeout=None, version=None):  # noqa: A003 (Django's name)
        try:
            super().set(key, value, timeout, version)
        except _UNREACHABLE as exc:
            self._unreachable(exc)

    def add(self, key, value, timeout=None, version=None):
        try:
            return super().add(key, value, timeout, version)
        except _UNREACHABLE as exc:
            self._unreachable(exc)
            return False

    def incr(self, key, delta=1, version=None):
        try:
            return super().incr(key, delta, version)
        except _UNREACHABLE as exc:
            self._unreachable(exc)
            return 0

    def delete(self, key, version=None):
        try:
            return super().delete(key, version)
        except _UNREACHABLE as exc:
            self._unreachable(exc)
            return False
