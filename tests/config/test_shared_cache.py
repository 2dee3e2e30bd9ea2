"""The API's throttles count in one place for every web process: Redis when REDIS_URL is set (two cache objects stand
for two processes here: neither keeps a count of its own), failing open while Redis is away; one Redis client per
process."""
from __future__ import annotations

import os

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.cache import CacheHandler
from django.test import RequestFactory
from rest_framework.throttling import AnonRateThrottle

from config.cache import FailOpenRedisCache
from tests.e2e.livestack import free_port
from tests.redisserver import needs_redis_server, redis_server

on_redis = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis: set REDIS_URL (CI does)")


class TwoPerMinute(AnonRateThrottle):
    rate = "2/min"
    scope = "anon-shared-test"


def _anonymous(address: str):
    request = RequestFactory().get("/api/v1/offers/", REMOTE_ADDR=address)
    request.user = AnonymousUser()
    return request


def _allowed(cache, request) -> bool:
    throttle = TwoPerMinute()
    throttle.cache = cache
    return throttle.allow_request(request, None)


@on_redis
def test_two_processes_share_one_throttle_count_on_redis():
    first, second = CacheHandler(settings.CACHES)["default"], CacheHandler(settings.CACHES)["default"]
    assert first is not second and isinstance(first, FailOpenRedisCache)
    request = _anonymous("198.51.100.7")
    first.delete(TwoPerMinute().get_cache_key(request, None))
    # Two requests through one process and the third through the other: the other has seen them.
    assert _allowed(first, request) and _allowed(first, request)
    assert not _allowed(second, request)


def test_without_redis_each_process_counts_in_its_own_memory():
    if os.environ.get("REDIS_URL"):
        assert settings.CACHES["default"]["BACKEND"] == "config.cache.FailOpenRedisCache"
    else:
        assert settings.CACHES["default"]["BACKEND"] == "django.core.cache.backends.locmem.LocMemCache"


def test_a_throttle_lets_requests_through_while_redis_is_away(caplog):
    cache = FailOpenRedisCache(f"redis://127.0.0.1:{free_port()}/0",
                               {"OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1}})
    request = _anonymous("198.51.100.8")
    assert all(_allowed(cache, request) for _ in range(3))  # not a 500 on every request: counted again later
    assert "the cache (Redis) is unreachable" in caplog.text


def test_the_cache_objects_of_a_process_share_one_client_for_the_same_redis():
    """Django makes a cache object per thread and ASGI a thread per request: each used to open its own pool."""
    options = {"OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1}}
    first = FailOpenRedisCache("redis://127.0.0.1:6390/0", options)
    second = FailOpenRedisCache("redis://127.0.0.1:6390/0", options)
    assert first._cache is second._cache
    assert first._cache._get_connection_pool(write=True) is second._cache._get_connection_pool(write=True)
    assert FailOpenRedisCache("redis://127.0.0.1:6390/1", options)._cache is not first._cache


@needs_redis_server
def test_requests_each_in_a_thread_of_their_own_reuse_one_redis_connection():
    """Counted by a Redis server of the test's own: the shared one has other clients (the other shard of `make
    test`)."""
    import threading

    import redis

    with redis_server() as url:
        caches = {"default": {"BACKEND": "config.cache.FailOpenRedisCache", "LOCATION": url,
                              "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1}}}

        def one_request():  # what ASGI does for each request: a new thread, so a new cache object
            cache = CacheHandler(caches)["default"]
            cache.set("shared-cache-test", 1, timeout=10)
            assert cache.get("shared-cache-test") == 1

        def connections() -> int:  # as the Redis server counts them
            with redis.Redis.from_url(url) as server:
                return server.info("stats")["total_connections_received"]

        one_request()
        before = connections()
        for _ in range(30):
            thread = threading.Thread(target=one_request)
            thread.start()
            thread.join()
        # 31 before (30 requests and the count): a connection and its handshake for every request. One is the
        # count's own.
        assert connections() - before <= 2
