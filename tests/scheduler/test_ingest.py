"""The metrics buffer: latest values and GPU-minute rollups that merge across flushes and web processes."""
from __future__ import annotations

import pytest
from channels.db import database_sync_to_async as sync_to_async  # closes its connection

from scheduler.gateway import ingest as ingest_module
from scheduler.gateway.ingest import MetricsIngest
from scheduler.models import GpuMetricLatest, GpuMetricRollup
from scheduler.services import nodes as node_services
from tests.agentframes import hello_from, sim_backend
from tests.factories import node_with_token

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = 1_800_000_000 // 60 * 60  # some minute boundary


def sample(temp, util=10.0, power=100.0):
    return {"util": util, "mem_used_mib": 1000.0, "mem_total_mib": 81920.0, "temp_c": temp, "power_w": power}


@pytest.fixture
def gpu():
    node, _ = node_with_token()
    node_services.node_hello(node_id=node.pk, frame=hello_from(sim_backend("h100-80gb:1", hostname="ing")))
    return node.gpus.get()


async def test_samples_of_one_minute_flushed_by_two_processes_merge_into_one_rollup(gpu):
    a, b = MetricsIngest(), MetricsIngest()  # two web processes, the agent reconnected between them
    a.add(node_id=gpu.node_id, ts=MINUTE + 1, samples=[(gpu.pk, sample(40)), ])
    a.add(node_id=gpu.node_id, ts=MINUTE + 2, samples=[(gpu.pk, sample(50, util=30))])
    await a.flush()
    b.add(node_id=gpu.node_id, ts=MINUTE + 30, samples=[(gpu.pk, sample(70, util=None))])
    await b.flush()
    b.add(node_id=gpu.node_id, ts=MINUTE + 61, samples=[(gpu.pk, sample(45))])  # the next minute
    await b.flush()

    rows = await sync_to_async(list)(GpuMetricRollup.objects.filter(gpu=gpu).order_by("minute"))
    assert [r.samples for r in rows] == [3, 1]
    first = rows[0]
    assert (first.temp_min, first.temp_max) == (40, 70)
    assert first.temp_avg == pytest.approx((40 + 50 + 70) / 3)
    assert (first.util_min, first.util_max) == (10, 30)  # the null reading counts in no metric
    latest = await sync_to_async(GpuMetricLatest.objects.get)(gpu=gpu)
    assert latest.temp_c == 45


async def test_a_failed_flush_keeps_its_samples_for_the_next_one(gpu, monkeypatch):
    buf = MetricsIngest(process=False)  # the failure is injected into this process's _write
    buf.add(node_id=gpu.node_id, ts=MINUTE + 1, samples=[(gpu.pk, sample(40))])
    real_write = ingest_module._write

    def broken(*args):
        raise RuntimeError("database went away")
    monkeypatch.setattr(ingest_module, "_write", broken)
    with pytest.raises(RuntimeError):
        await buf.flush()
    monkeypatch.setattr(ingest_module, "_write", real_write)
    buf.add(node_id=gpu.node_id, ts=MINUTE + 2, samples=[(gpu.pk, sample(60))])
    await buf.flush()
    row = await sync_to_async(GpuMetricRollup.objects.get)(gpu=gpu)
    assert row.samples == 2 and (row.temp_min, row.temp_max) == (40, 60)


async def test_a_long_database_outage_keeps_only_the_newest_gpu_minutes_and_counts_and_logs_the_dropped_ones(
        gpu, monkeypatch, settings, caplog):
    settings.FLEET = {**settings.FLEET, "METRICS_BUFFER_MAX_ROLLUPS": 3}
    buf = MetricsIngest(process=False)

    def broken(*args):
        raise RuntimeError("database went away")
    monkeypatch.setattr(ingest_module, "_write", broken)
    for minute in range(5):  # five minutes of outage, one flush failing each minute
        buf.add(node_id=gpu.node_id, ts=MINUTE + 60 * minute + 1, samples=[(gpu.pk, sample(40 + minute))])
        with pytest.raises(RuntimeError):
            await buf.flush()
        assert len(buf.rollups) <= 3
    assert sorted(m for _, m in buf.rollups) == [MINUTE + 120, MINUTE + 180, MINUTE + 240]  # the oldest went
    assert buf.rollups_dropped == 2
    assert "dropped" in caplog.text and "GPU-minute" in caplog.text
    assert buf.latest[gpu.pk][1]["temp_c"] == 44  # the latest reading per GPU is bounded anyway, kept
