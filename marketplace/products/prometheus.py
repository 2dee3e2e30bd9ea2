"""What `/metrics` shows Prometheus, read from the database at scrape time.

Every figure comes from the tables that are the truth (the agents' latest readings, orders, leases, the ledger),
not from per-process counters: a deployment runs several web processes and workers, and a counter kept in one of
them would be a different number on every scrape. Counters here are counts of rows that are never deleted, so they
only go up, as Prometheus expects of a counter.

GPU gauges are named as NVIDIA's DCGM exporter names them (`DCGM_FI_DEV_GPU_UTIL`, ...) with its labels (`gpu`,
`UUID`, `Hostname`, `modelName`, `DCGM_FI_DRIVER_VERSION`) plus ours (`node`, `region`), so dashboards written
for dcgm-exporter work on the market's fleet. A GPU's series is there only while its node is online and its
reading is fresh: a stale value shown as current is worse than a gap. MIG instances get an info series with
dcgm-exporter's `GPU_I_PROFILE` label (and the placement start and MIG device UUID, which it does not have)."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, OuterRef, Q, Subquery, Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from marketplace.models import LedgerTransaction, Lease, Order, SpotPrice
from scheduler.models import Gpu, GpuMetricLatest, GpuMetricRollup, Node, Slice

# Seconds from an order to its lease running (placement, MIG carve, container start): buckets for the histogram.
ORDER_TO_RUNNING_BUCKETS = (1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
GPU_LABELS = ["gpu", "UUID", "Hostname", "modelName", "DCGM_FI_DRIVER_VERSION", "node", "region"]
# (metric name, help, GpuMetricLatest field or a function of the row); units as dcgm-exporter's.
DCGM_GAUGES = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda r: r.util),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda r: r.mem_used_mib),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
     lambda r: None if r.mem_total_mib is None or r.mem_used_mib is None else r.mem_total_mib - r.mem_used_mib),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda r: r.temp_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda r: r.power_w),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda r: r.sm_clock_mhz),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", lambda r: r.ecc_sbe),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", lambda r: r.ecc_dbe),
)


CONNECTED = (Node.Status.ONLINE, Node.Status.DRAINING)  # nodes whose agent is there and reporting


def _fresh_after():
    """Readings older than the heartbeat timeout are not current (the node would be going offline)."""
    return timezone.now() - timedelta(seconds=settings.FLEET["HEARTBEAT_TIMEOUT_SECONDS"])


def _gpu_families() -> Iterator:
    families = {name: GaugeMetricFamily(name, text, labels=GPU_LABELS) for name, text, _ in DCGM_GAUGES}
    rows = (GpuMetricLatest.objects
            .filter(gpu__present=True, gpu__node__status__in=CONNECTED, at__gte=_fresh_after())
            .select_related("gpu__node", "gpu__gpu_model").order_by("gpu__node__name", "gpu__index"))
    for row in rows:
        gpu, node = row.gpu, row.gpu.node
        labels = [str(gpu.index), gpu.uuid, node.hostname or node.name, gpu.gpu_model.name if gpu.gpu_model else gpu.name,
                  node.driver_version, str(node.id), node.region]
        for name, _, read in DCGM_GAUGES:
            value = read(row)
            if value is not None:
                families[name].add_metric(labels, float(value))
    yield from families.values()

    mig = GaugeMetricFamily("gpumarket_mig_instance_info", "A MIG instance carved on a GPU for a lease (value 1).",
                            labels=["gpu", "UUID", "Hostname", "GPU_I_PROFILE", "GPU_I_START", "MIG_UUID", "state"])
    slices = (Slice.objects.filter(state__in=[Slice.State.CREATING, Slice.State.READY], gpu__node__status__in=CONNECTED)
              .exclude(profile="").select_related("gpu__node").order_by("gpu__node__name", "gpu__index", "start"))
    for s in slices:
        mig.add_metric([str(s.gpu.index), s.gpu.uuid, s.gpu.node.hostname or s.gpu.node.name, s.profile, str(s.start),
                        s.instance_uuid, s.state], 1.0)
    yield mig


def _fleet_families() -> Iterator:
    nodes = GaugeMetricFamily("gpumarket_nodes", "Nodes by status and region.", labels=["status", "region"])
    for row in Node.objects.exclude(status=Node.Status.DELETED).values("status", "region").annotate(n=Count("id")).order_by():
        nodes.add_metric([row["status"], row["region"]], row["n"])
    yield nodes

    gpus = GaugeMetricFamily("gpumarket_gpus", "GPUs present on nodes that are not deleted, by model, region and health.",
                             labels=["modelName", "region", "health", "mig"])
    for row in (Gpu.objects.filter(present=True).exclude(node__status=Node.Status.DELETED)
                .values("gpu_model__name", "node__region", "health", "mig_enabled").annotate(n=Count("id")).order_by()):
        gpus.add_metric([row["gpu_model__name"] or "unknown", row["node__region"], row["health"],
                         "true" if row["mig_enabled"] else "false"], row["n"])
    yield gpus

    sockets = GaugeMetricFamily("gpumarket_agent_sockets", "Agents connected now (one websocket per node).")
    sockets.add_metric([], Node.objects.filter(status__in=CONNECTED, connected_at__isnull=False).count())
    yield sockets
    opened = CounterMetricFamily("gpumarket_agent_sockets_opened", "Agent websockets accepted since each node registered.")
    opened.add_metric([], Node.objects.aggregate(n=Sum("agent_sockets_opened"))["n"] or 0)
    yield opened

    # The last complete minute's rollups of GPUs now online: samples the gateway ingested per second. Filtering by
    # GPU keeps this on the (gpu, minute) index instead of scanning the whole rollup table.
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=1)
    online = Gpu.objects.filter(node__status__in=CONNECTED).values("id")
    samples = GpuMetricRollup.objects.filter(gpu_id__in=online, minute=minute).aggregate(n=Sum("samples"))["n"] or 0
    ingest = GaugeMetricFamily("gpumarket_metrics_ingest_samples_per_second",
                               "GPU samples ingested per second over the last complete minute.")
    ingest.add_metric([], samples / 60.0)
    yield ingest


def _market_families() -> Iterator:
    orders = CounterMetricFamily("gpumarket_orders", "Orders placed by buyers, by mode and outcome (queued, placed, "
                                 "failed, cancelled: an order's state now).", labels=["mode", "outcome"])
    for row in Order.objects.values("mode", "state").annotate(n=Count("id")).order_by():
        orders.add_metric([row["mode"], row["state"]], row["n"])
    yield orders

    running = GaugeMetricFamily("gpumarket_leases_running", "Leases running now, by mode.", labels=["mode"])
    for row in (Lease.objects.filter(state__in=[Lease.State.RUNNING, Lease.State.INTERRUPTING])
                .values("mode").annotate(n=Count("id")).order_by()):
        running.add_metric([row["mode"]], row["n"])
    yield running

    latency = ExpressionWrapper(F("started_at") - F("order__created_at"), output_field=DurationField())
    buckets = {f"le_{b}": Count("id", filter=Q(latency__lte=timedelta(seconds=b))) for b in ORDER_TO_RUNNING_BUCKETS}
    # One pass: the buckets, the count and the sum of observations (PostgreSQL and SQLite both sum a duration).
    started = (Lease.objects.filter(order__isnull=False, started_at__isnull=False).annotate(latency=latency)
               .aggregate(count=Count("id"), total=Sum("latency"), **buckets))
    total = started["total"] or timedelta(0)
    hist = HistogramMetricFamily("gpumarket_order_to_running_seconds",
                                 "Seconds from an order to its lease running (placement, carving, start).")
    hist.add_metric([], [(str(float(b)), started[f"le_{b}"]) for b in ORDER_TO_RUNNING_BUCKETS]
                    + [("+Inf", started["count"])], sum_value=total.total_seconds())
    yield hist

    spot = GaugeMetricFamily("gpumarket_spot_price_usd_per_gpu_hour", "The spot price of a whole GPU-hour now, by model.",
                             labels=["model"])
    latest = SpotPrice.objects.filter(gpu_model=OuterRef("gpu_model")).order_by("-at").values("at")[:1]
    for p in SpotPrice.objects.filter(at=Subquery(latest)).order_by("gpu_model"):
        spot.add_metric([p.gpu_model], float(p.price_per_gpu_hour))
    yield spot

    postings = CounterMetricFamily("gpumarket_ledger_postings", "Balanced ledger transactions posted, by kind.",
                                   labels=["kind"])
    for row in LedgerTransaction.objects.values("kind").annotate(n=Count("id")).order_by("kind"):
        postings.add_metric([row["kind"]], row["n"])
    yield postings


class MarketCollector(Collector):
    """The fleet's GPU gauges and the market's counters, read fresh at each scrape."""

    def collect(self) -> Iterator:
        yield from _gpu_families()
        yield from _fleet_families()
        yield from _market_families()


def metrics_registry() -> CollectorRegistry:
    """A registry of its own (not prometheus_client's global one): only what the market reads from its tables."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MarketCollector())
    return registry
