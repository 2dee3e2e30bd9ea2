"""The Redis channel layer as configured copes with more concurrent sends than redis-py's default pool."""
from __future__ import annotations

import asyncio
import os

import pytest
from channels.layers import get_channel_layer

pytestmark = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis: set REDIS_URL (CI does)")


async def test_hundreds_of_concurrent_group_sends_do_not_exhaust_the_connection_pool():
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add("pool-test", channel)
    try:
        # 300 > redis-py's default of 100 connections: each send holds one while in flight.
        await asyncio.gather(*(layer.group_send("pool-test", {"type": "x", "n": i}) for i in range(300)))
        got = {(await layer.receive(channel))["n"] for _ in range(300)}
        assert got == set(range(300))
    finally:
        await layer.group_discard("pool-test", channel)
        await layer.flush()
