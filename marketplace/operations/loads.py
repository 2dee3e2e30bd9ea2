"""What reclaim and autoscaling read: each lease's utilisation per whole minute, from its GPU's metrics rollups.

A whole GPU's lease reads its GPU's utilisation. A MIG slice's lease reads its GPU's utilisation divided by the
slice's share of the GPU's compute (capped at 100%): the most the slice can have been busy, since the others on
the GPU add to that reading too. So reclaim never ends a busy slice for a neighbour's quiet (it may keep an idle
one); on real MIG GPUs NVML gives no whole-GPU utilisation at all, and such leases have no readings, so nothing
is done to them."""
from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from marketplace.models import Lease
from scheduler.models import GpuMetricRollup

from .decide import LeaseLoad


def compute_share(lease: Lease) -> float:
    """The lease's share of its GPU's compute: 1 for a whole GPU, a MIG profile's compute slices over the GPU's."""
    sl = lease.slice
    geometry = sl.gpu.geometry() if sl.profile else None
    if geometry is None:
        return 1.0
    try:
        return geometry.profile(sl.profile).compute_slices / geometry.compute_slices
    except KeyError:
        return 1.0


def lease_loads(*, leases: list[Lease], now: datetime, minutes: int) -> dict[str, LeaseLoad]:
    """Each lease's utilisation in the `minutes` whole minutes before `now` (leases with slice__gpu loaded), by
    lease id. One query for all of them."""
    current = now.replace(second=0, microsecond=0)
    by_gpu: dict = defaultdict(dict)
    rows = GpuMetricRollup.objects.filter(gpu_id__in={lease.slice.gpu_id for lease in leases},
                                          minute__gte=current - timedelta(minutes=minutes), minute__lt=current,
                                          samples__gt=0, util_avg__isnull=False)
    for gpu_id, minute, util in rows.values_list("gpu_id", "minute", "util_avg"):
        by_gpu[gpu_id][minute] = util
    out = {}
    for lease in leases:
        share = compute_share(lease)
        out[str(lease.pk)] = LeaseLoad(lease=str(lease.pk), started_at=lease.started_at,
                                       util={m: min(100.0, u / share) for m, u in by_gpu[lease.slice.gpu_id].items()})
    return out
