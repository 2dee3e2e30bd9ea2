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


async def test_an_idle_receive_outlasts_the_layers_blocking_pop_instead_of_timing_out_its_socket():
    """redis-py 8 reads with a 5 s socket timeout by default, the same as the layer's BZPOPMIN: an idle socket's
    receive then raised "Timeout reading" and closed its websocket every few seconds. The configured timeout is
    longer, so an idle receive just waits (here past a blocking pop) for what arrives."""
    layer = get_channel_layer()
    timeout = layer.connection(0).connection_pool.connection_kwargs["socket_timeout"]
    assert timeout > layer.brpop_timeout * 2
    channel = await layer.new_channel()
    waiting = asyncio.ensure_future(layer.receive(channel))
    await asyncio.sleep(layer.brpop_timeout + 1)
    assert not waiting.done()  # still waiting, no error
    await layer.send(channel, {"type": "x", "n": 1})
    assert (await asyncio.wait_for(waiting, 10))["n"] == 1
    await layer.flush()
