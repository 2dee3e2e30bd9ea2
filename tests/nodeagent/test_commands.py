"""Idempotent command execution: a repeated id is answered from the log, an in-flight one waits."""
import asyncio
import threading

from nodeagent import protocol
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.commands import CommandLog


class SlowBackend(SimulatedBackend):
    def __init__(self):
        super().__init__("h100-80gb:1", hostname="slow", seed=1)
        self.release = threading.Event()
        self.creates = 0

    def create_instance(self, gpu_uuid, profile, start):
        self.creates += 1
        assert self.release.wait(10)
        return super().create_instance(gpu_uuid, profile, start)


async def test_an_in_flight_duplicate_waits_for_the_first_execution():
    backend = SlowBackend()
    log = CommandLog(backend)
    gpu = backend.inventory()["gpus"][0]["uuid"]
    args = {"gpu_uuid": gpu, "profile": "7g.80gb", "start": 0}
    first = asyncio.create_task(log.answer("c1", "create_instance", args))
    second = asyncio.create_task(log.answer("c1", "create_instance", args))
    await asyncio.sleep(0)
    backend.release.set()
    a, b = await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert a == b and a["ok"] and backend.creates == 1 and log.executions == 1


async def test_a_cancelled_asker_does_not_lose_the_result_for_the_retry():
    backend = SlowBackend()
    log = CommandLog(backend)
    gpu = backend.inventory()["gpus"][0]["uuid"]
    args = {"gpu_uuid": gpu, "profile": "7g.80gb", "start": 0}
    asker = asyncio.create_task(log.answer("c1", "create_instance", args))
    await asyncio.sleep(0)
    asker.cancel()  # the connection that asked went away
    backend.release.set()
    retry = await asyncio.wait_for(log.answer("c1", "create_instance", args), 10)
    assert retry["ok"] and backend.creates == 1


async def test_errors_are_stored_too_and_old_ids_are_forgotten_past_capacity():
    backend = SimulatedBackend("h100-80gb:1", hostname="n", seed=1)
    log = CommandLog(backend, capacity=2)
    bad = {"gpu_uuid": "GPU-none", "profile": "7g.80gb", "start": 0}
    first = await log.answer("a", "create_instance", bad)
    assert first["error"]["code"] == protocol.E_NOT_FOUND
    assert await log.answer("a", "create_instance", bad) == first and log.executions == 1
    await log.answer("b", "ping", {})
    await log.answer("c", "ping", {})
    await log.answer("a", "create_instance", bad)
    assert log.executions == 4  # "a" had been evicted, so it ran again
