"""GET /metrics: the token, the DCGM-named GPU gauges with their labels, and the market's counters, parsed with
prometheus_client's parser; then scraped by a real Prometheus server (Debian's `prometheus`) where it is installed
(CI installs it)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from datetime import timedelta
from decimal import Decimal as D
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from django.core.wsgi import get_wsgi_application
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from marketplace.models import Lease, Order, SpotPrice
from marketplace.products import orders
from marketplace.products.orders import OrderSpec
from scheduler.models import Gpu, GpuMetricLatest, Node
from tests.factories import UserFactory, node_with_token
from tests.marketplace.marketsim import Fleet, top_up

pytestmark = pytest.mark.django_db
TOKEN = "t" * 24


def scrape(client, token: str | None = TOKEN):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.get("/metrics", **headers)


def families(response) -> dict:
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def reading(gpu: Gpu, *, util: float, age_s: float = 0, used: float = 1000.0) -> None:
    GpuMetricLatest.objects.update_or_create(gpu=gpu, defaults=dict(
        at=timezone.now() - timedelta(seconds=age_s), util=util, mem_used_mib=used, mem_total_mib=81920.0,
        temp_c=61.0, power_w=250.5, sm_clock_mhz=1410.0, ecc_sbe=3, ecc_dbe=0))


def test_metrics_are_off_without_a_token_and_refuse_a_wrong_one(client, settings):
    settings.METRICS_TOKEN = None
    off = scrape(client)
    assert off.status_code == 404 and off.json()["error"]["code"] == "not_found"
    settings.METRICS_TOKEN = TOKEN
    for token in (None, "wrong-token-of-some-length", TOKEN + "x"):
        r = scrape(client, token)
        assert r.status_code == 401, token
        assert r["WWW-Authenticate"].startswith("Bearer") and r.json()["error"]["code"] == "not_authenticated"
    assert scrape(client).status_code == 200
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_gpu_gauges_carry_dcgm_names_and_labels_and_only_fresh_readings_of_connected_nodes(client, settings):
    settings.METRICS_TOKEN = TOKEN
    fleet = Fleet()
    node = fleet.node("a100-80gb:2", region="eu-west")
    gone = fleet.node("l4:1", region="us-east")
    g0, g1 = node.gpus.order_by("index")
    reading(g0, util=87.5)
    reading(g1, util=12.0, age_s=settings.FLEET["HEARTBEAT_TIMEOUT_SECONDS"] + 5)  # stale: no series
    reading(gone.gpus.get(), util=50.0)
    Node.objects.filter(pk=gone.pk).update(status=Node.Status.OFFLINE)  # not connected: no series

    fams = families(scrape(client))
    util = fams["DCGM_FI_DEV_GPU_UTIL"]
    assert util.type == "gauge"
    [sample] = util.samples
    assert sample.value == 87.5
    labels = sample.labels
    assert labels["gpu"] == "0" and labels["UUID"] == g0.uuid and labels["modelName"] == g0.gpu_model.name
    assert labels["Hostname"] == node.hostname and labels["region"] == "eu-west" and labels["node"] == str(node.pk)
    assert "DCGM_FI_DRIVER_VERSION" in labels
    assert fams["DCGM_FI_DEV_FB_USED"].samples[0].value == 1000.0
    assert fams["DCGM_FI_DEV_FB_FREE"].samples[0].value == 81920.0 - 1000.0
    assert fams["DCGM_FI_DEV_GPU_TEMP"].samples[0].value == 61.0
    assert fams["DCGM_FI_DEV_POWER_USAGE"].samples[0].value == 250.5
    assert fams["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"].samples[0].value == 3
    gpus = {(s.labels["modelName"], s.labels["region"]): s.value for s in fams["gpumarket_gpus"].samples}
    assert gpus[(g0.gpu_model.name, "eu-west")] == 2
    nodes = {(s.labels["status"], s.labels["region"]): s.value for s in fams["gpumarket_nodes"].samples}
    assert nodes[("online", "eu-west")] == 1 and nodes[("offline", "us-east")] == 1


def test_market_counters_count_orders_leases_latency_spot_prices_and_postings(client, settings):
    settings.METRICS_TOKEN = TOKEN
    fleet = Fleet()
    fleet.node("a100-80gb:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    placed = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True))
    fleet.play()
    lease = Lease.objects.get(order=placed)
    assert lease.state == Lease.State.RUNNING
    # The order took 7 s to run: one observation in the 10 s bucket and above, none in the 5 s one.
    Order.objects.filter(pk=placed.pk).update(created_at=lease.started_at - timedelta(seconds=7))
    waiting = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True, if_unavailable="queue"))
    assert waiting.state == Order.State.QUEUED  # nothing free: it waits
    SpotPrice.objects.create(gpu_model="a100-80gb", at=timezone.now() - timedelta(minutes=5), factor=D("0.6"),
                             free_share=0.5, price_per_gpu_hour=D("1.2"))
    SpotPrice.objects.create(gpu_model="a100-80gb", at=timezone.now(), factor=D("0.55"), free_share=0.6,
                             price_per_gpu_hour=D("1.1"))

    fams = families(scrape(client))
    counted = {(s.labels["mode"], s.labels["outcome"]): s.value for s in fams["gpumarket_orders"].samples
               if s.name == "gpumarket_orders_total"}
    assert counted == {("on_demand", "placed"): 1, ("on_demand", "queued"): 1}
    assert [(s.labels["mode"], s.value) for s in fams["gpumarket_leases_running"].samples] == [("on_demand", 1)]
    hist = {s.labels.get("le"): s.value for s in fams["gpumarket_order_to_running_seconds"].samples
            if s.name.endswith("_bucket")}
    assert hist["5.0"] == 0 and hist["10.0"] == 1 and hist["+Inf"] == 1
    [total] = [s.value for s in fams["gpumarket_order_to_running_seconds"].samples if s.name.endswith("_sum")]
    assert total == pytest.approx(7.0, abs=0.01)
    assert [(s.labels["model"], s.value) for s in fams["gpumarket_spot_price_usd_per_gpu_hour"].samples] == [
        ("a100-80gb", 1.1)]
    postings = {s.labels["kind"]: s.value for s in fams["gpumarket_ledger_postings"].samples}
    assert postings["topup"] == 1
    assert fams["gpumarket_agent_sockets"].samples[0].value == 1  # the one node whose agent said hello


def test_mig_instances_ingest_rate_and_agent_sockets_are_exported_with_their_values(client, settings, monkeypatch):
    """A leased MIG slice is an info series with dcgm-exporter's GPU_I_PROFILE label (and its start and MIG UUID);
    the ingest rate is the last complete minute's samples per second; sockets opened count every accepted
    agent socket."""
    from scheduler.models import GpuMetricRollup, Slice
    from scheduler.services import nodes as node_services

    settings.METRICS_TOKEN = TOKEN
    fleet = Fleet()
    node = fleet.node("a100-80gb:1")
    buyer = UserFactory()
    top_up(buyer, "100")
    orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", gpu_models=["a100-80gb"], memory_gb=10))
    fleet.play()
    carved = Slice.objects.get(gpu__node=node, state=Slice.State.READY)
    assert carved.profile == "1g.10gb" and carved.instance_uuid
    gpu = node.gpus.get()
    frozen = timezone.now()  # the scrape's clock: its last complete minute is the one written below
    minute = frozen.replace(second=0, microsecond=0) - timedelta(minutes=1)
    GpuMetricRollup.objects.create(gpu=gpu, minute=minute, samples=120, util_avg=40.0)
    GpuMetricRollup.objects.create(gpu=gpu, minute=minute - timedelta(minutes=1), samples=999, util_avg=40.0)
    _, token = node_with_token(provider=UserFactory())
    opened_before = sum(Node.objects.values_list("agent_sockets_opened", flat=True))
    for _ in range(3):
        assert node_services.node_agent_connect(token=token) is not None

    monkeypatch.setattr(timezone, "now", lambda: frozen)
    fams = families(scrape(client))
    monkeypatch.undo()
    [mig] = fams["gpumarket_mig_instance_info"].samples
    assert mig.value == 1.0
    assert mig.labels == {"gpu": "0", "UUID": gpu.uuid, "Hostname": node.hostname or node.name,
                          "GPU_I_PROFILE": "1g.10gb", "GPU_I_START": str(carved.start),
                          "MIG_UUID": carved.instance_uuid, "state": "ready"}
    [ingest] = fams["gpumarket_metrics_ingest_samples_per_second"].samples
    assert ingest.value == 2.0  # 120 samples in the last complete minute; the minute before is not counted
    [opened] = [s for s in fams["gpumarket_agent_sockets_opened"].samples if s.name.endswith("_total")]
    assert opened.value == opened_before + 3


def test_the_scrape_reads_in_a_constant_number_of_queries(client, settings, django_assert_max_num_queries):
    settings.METRICS_TOKEN = TOKEN
    fleet = Fleet()
    for _ in range(2):
        for gpu in fleet.node("a100-80gb:4").gpus.all():
            reading(gpu, util=40.0)
    with django_assert_max_num_queries(20) as few:
        scrape(client)
    for _ in range(3):
        for gpu in fleet.node("h100-80gb:8").gpus.all():
            reading(gpu, util=40.0)
    with django_assert_max_num_queries(len(few.captured_queries)):
        scrape(client)


# --- a real Prometheus server ---------------------------------------------------------------------------------------

PROMETHEUS = shutil.which("prometheus")


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # the scrapes, every second: not for the test's output
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(PROMETHEUS is None and not os.environ.get("GPUMARKET_REQUIRE_ENGINE"),
                    reason="Debian's prometheus package is not installed (.ci/run installs it)")
def test_a_real_prometheus_server_scrapes_the_fleet_with_the_token(settings, tmp_path):
    assert PROMETHEUS, "CI installs Debian's prometheus"
    settings.METRICS_TOKEN = TOKEN
    fleet = Fleet()
    node = fleet.node("h100-80gb:2")
    for gpu in node.gpus.all():
        reading(gpu, util=55.0 + gpu.index)
    # A web server of this test's own, stopped with it (pytest-django's live_server would serve, and hold database
    # connections, for the rest of the session).
    web = make_server("127.0.0.1", 0, get_wsgi_application(), handler_class=QuietHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{web.server_port}"
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpumarket\n"
        "    metrics_path: /metrics\n"
        f"    authorization: {{type: Bearer, credentials: {TOKEN}}}\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n")
    port = _free_port()
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
    try:
        query = urllib.parse.quote('DCGM_FI_DEV_GPU_UTIL{job="gpumarket"}')
        deadline, result = time.monotonic() + 60, []
        while time.monotonic() < deadline and len(result) < 2:
            try:
                result = _get_json(f"http://127.0.0.1:{port}/api/v1/query?query={query}")["data"]["result"]
            except OSError:
                pass
            if len(result) < 2:
                time.sleep(0.25)
        assert len(result) == 2, (tmp_path / "prometheus.log").read_text()[-3000:]
        by_gpu = {r["metric"]["gpu"]: r for r in result}
        assert float(by_gpu["0"]["value"][1]) == 55.0 and float(by_gpu["1"]["value"][1]) == 56.0
        assert by_gpu["1"]["metric"]["modelName"] and by_gpu["1"]["metric"]["UUID"].startswith("GPU-")
        [up] = _get_json(f"http://127.0.0.1:{port}/api/v1/targets")["data"]["activeTargets"]
        assert up["health"] == "up", up
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        web.shutdown()
        web.server_close()


def test_every_series_the_grafana_dashboard_queries_is_one_metrics_exports(client, settings):
    """docs/grafana-dashboard.json stays true: each metric name in its queries is exported (with the suffixes
    Prometheus gives counters and histograms)."""
    import re

    from tests.conftest import ROOT

    settings.METRICS_TOKEN = TOKEN
    fleet = Fleet()
    for gpu in fleet.node("a100-80gb:1").gpus.all():
        reading(gpu, util=10.0)
    buyer = UserFactory()
    top_up(buyer, "10")
    orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True))
    exported = set()
    for family in families(scrape(client)).values():
        exported |= {s.name for s in family.samples} | {family.name}
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if v.get("definition")]
    names = {n for q in queries for n in re.findall(r"\b(DCGM_FI_[A-Z_]+|gpumarket_[a-z_]+)\b", q)}
    assert len(names) >= 12
    assert names <= exported, sorted(names - exported)
