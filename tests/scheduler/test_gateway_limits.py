"""Per-socket limits on agent frames: the token bucket (pure), and the gateway enforcing it."""
from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from nodeagent import protocol
from scheduler.gateway.ingest import INGEST
from scheduler.gateway.limits import DropWindow, TokenBucket
from scheduler.models import HealthEvent
from tests.agentframes import metrics_from, sim_backend
from tests.factories import node_with_token
from tests.scheduler.test_gateway import barrier, connect_agent, expect_close


@pytest.mark.parametrize("rate, burst, arrivals, expect", [
    (1.0, 2, [0.0, 0.0, 0.0], [True, True, False]),            # a burst of 2, the third waits
    (1.0, 2, [0.0, 0.0, 0.0, 1.0], [True, True, False, True]),  # one second refills one token
    (1.0, 1, [0.0, 1.0, 2.0, 3.0], [True] * 4),                 # an agent at its interval is never refused
    (1.0, 1, [0.0, 0.5, 1.0, 1.5], [True, False, True, False]),  # twice the rate: every other frame
    (2.0, 3, [0.0, 100.0, 100.0, 100.0, 100.0], [True, True, True, True, False]),  # idle time caps at burst
])
def test_a_token_bucket_lets_its_rate_and_burst_through_and_refuses_the_rest(rate, burst, arrivals, expect):
    bucket = TokenBucket(rate=rate, burst=burst, last=0.0)
    assert [bucket.take(now=t) for t in arrivals] == expect


def test_a_drop_window_says_close_only_past_its_count_within_the_window():
    window = DropWindow(window=10, max_dropped=2, since=0.0)
    assert [window.drop(now=t) for t in (1, 2, 3)] == [False, False, True]
    assert window.drop(now=20) is False  # a new window starts over


pytestmark_db = pytest.mark.django_db(transaction=True)


def limited(settings, **fleet):
    # Rates far below one frame a second: a slow test run must not refill a token between frames.
    settings.FLEET = {**settings.FLEET, "AGENT_METRICS_RATE": 0.001, "AGENT_METRICS_BURST": 3,
                      "AGENT_EVENT_RATE": 0.001, "AGENT_EVENT_BURST": 3, "AGENT_EVENT_DETAIL_MAX_BYTES": 256,
                      "AGENT_MAX_DROPPED": 5, "AGENT_DROP_WINDOW_SECONDS": 60, **fleet}


@pytestmark_db
async def test_metrics_frames_over_the_rate_get_an_error_frame_and_are_dropped(settings):
    limited(settings)
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("l4:1", hostname="fast")
    comm = await connect_agent(token, backend)
    INGEST.samples_total = 0
    for _ in range(5):  # back to back: a burst of 3 passes
        await comm.send_to(text_data=protocol.encode(metrics_from(backend)))
    errors = [json.loads(await comm.receive_from(timeout=5)) for _ in range(2)]
    assert [e["code"] for e in errors] == [protocol.E_RATE_LIMITED] * 2
    await barrier(comm)
    assert INGEST.samples_total == 3  # the dropped frames wrote nothing
    await comm.disconnect()


@pytestmark_db
async def test_an_agent_that_keeps_flooding_is_closed_with_4400(settings):
    limited(settings)
    node, token = await sync_to_async(node_with_token)()
    backend = sim_backend("l4:1", hostname="flood")
    comm = await connect_agent(token, backend)
    for _ in range(3 + 6):  # the burst, then more drops than the window allows
        await comm.send_to(text_data=protocol.encode(metrics_from(backend)))
    await expect_close(comm, 4400)


@pytestmark_db
async def test_event_frames_are_rate_limited_and_their_detail_capped_in_size(settings):
    limited(settings)
    node, token = await sync_to_async(node_with_token)()
    comm = await connect_agent(token, sim_backend("l4:1", hostname="chatty"))
    big = protocol.event(kind="fault", detail={"message": "x" * 300})
    await comm.send_to(text_data=protocol.encode(big))
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["code"] == protocol.E_BAD_FRAME and "256" in err["message"]
    for i in range(3):  # the burst of 3 (the refused big one spent a token), the third is over the rate
        await comm.send_to(text_data=protocol.encode(protocol.event(kind="fault", detail={"message": f"e{i}"})))
    err = json.loads(await comm.receive_from(timeout=5))
    assert err["code"] == protocol.E_RATE_LIMITED
    await barrier(comm)
    kinds = await sync_to_async(lambda: sorted(HealthEvent.objects.filter(node=node, kind="fault")
                                               .values_list("message", flat=True)))()
    assert kinds == ["e0", "e1"]
    await comm.disconnect()


@pytest.mark.parametrize("env", [
    {"FLEET_AGENT_METRICS_RATE": "fast"},
    {"FLEET_AGENT_EVENT_DETAIL_MAX_BYTES": "-1"},
    {"FLEET_POWER_CORDON_SHARE": "0.5"},
    {"FLEET_AGENT_METRICS_RATE": "1", "FLEET_METRICS_INTERVAL": "1"},  # would refuse healthy agents
])
def test_agent_limits_and_power_thresholds_are_read_strictly_at_start_up(env, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environ.update({**env, "DJANGO_SETTINGS_MODULE": "config.settings.dev", "GPUMARKET_VAR_DIR": str(tmp_path)})
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=Path(__file__).resolve().parents[2],
                          env=environ, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"environment variable {next(iter(env))}" in proc.stderr and "Traceback" not in proc.stderr
