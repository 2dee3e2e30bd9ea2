"""GPU health: thresholds that cordon a GPU, and cordon/uncordon by hand (its provider or an operator)."""
from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from scheduler.errors import PermissionDenied
from scheduler.models import Gpu, HealthEvent

from .events import announce_node, tell_agent_uncordoned
from .reliability import reliability_refresh_later


@dataclass(frozen=True)
class Thresholds:
    max_temperature_c: float
    max_ecc_dbe: int
    cordon_xids: frozenset[int]
    # Power above power_share x the model's TDP for power_samples samples in a row: one sample over is a
    # transient NVIDIA allows (boost), a sustained draw past the board's rating is a failing regulator or
    # sensor, or a board running out of spec.
    power_share: float = 1.1
    power_samples: int = 5

    @classmethod
    def from_settings(cls) -> "Thresholds":
        f = settings.FLEET
        return cls(f["MAX_TEMPERATURE_C"], f["MAX_ECC_DBE"], frozenset(f["CORDON_XIDS"]),
                   power_share=f["POWER_CORDON_SHARE"], power_samples=f["POWER_CORDON_SAMPLES"])


def power_over_limit(sample: dict, thresholds: Thresholds, *, tdp_w: float | None) -> bool:
    """Whether this sample draws more than the share of its model's TDP (never without a reading or a
    known TDP). Pure; the caller counts the streak."""
    power = sample.get("power_w")
    return bool(tdp_w) and power is not None and power > thresholds.power_share * tdp_w


def sample_violations(sample: dict, thresholds: Thresholds, *, previous_dbe: float | None,
                      tdp_w: float | None = None, samples_over_power: int = 0) -> list[str]:
    """Why this metrics sample should cordon its GPU (empty: healthy). Pure.

    ECC double-bit errors count when they pass the threshold and grew since the previous sample (or on
    the first sample seen), so an operator's uncordon holds until new errors arrive. Power counts when this
    sample is over the limit and so were the `samples_over_power` before it, power_samples in all.
    """
    reasons = []
    temp = sample.get("temp_c")
    if temp is not None and temp >= thresholds.max_temperature_c:
        reasons.append(f"temperature {temp:.0f} °C ≥ {thresholds.max_temperature_c:.0f} °C")
    if power_over_limit(sample, thresholds, tdp_w=tdp_w) and samples_over_power + 1 >= thresholds.power_samples:
        reasons.append(f"power {sample['power_w']:.0f} W > {thresholds.power_share:g} × TDP {tdp_w:.0f} W for "
                       f"{samples_over_power + 1} samples")
    dbe = sample.get("ecc_dbe")
    if dbe is not None and dbe > thresholds.max_ecc_dbe and (previous_dbe is None or dbe > previous_dbe):
        reasons.append(f"{int(dbe)} uncorrectable ECC errors")
    bad_xids = sorted({x for x in sample.get("xid") or () if x in thresholds.cordon_xids})
    if bad_xids:
        reasons.append("XID " + ", ".join(map(str, bad_xids)))
    return reasons


# What the reliability score calls each reason sample_violations gives (by its opening words).
_CAUSES = (("temperature", "thermal"), ("power", "power"), ("XID", "xid"))


def violation_causes(reason: str) -> list[str]:
    """The causes ("thermal", "power", "ecc", "xid") in a cordon reason made of sample_violations' reasons."""
    out = []
    for part in reason.split("; "):
        if "uncorrectable ECC" in part:
            out.append("ecc")
        else:
            out += [cause for opening, cause in _CAUSES if part.startswith(opening)]
    return out


def cordon_source_of(user) -> str:
    """Who a person cordoning or uncordoning by hand is: an operator (staff), else the GPU's provider."""
    return Gpu.CordonedBy.OPERATOR if user.is_staff else Gpu.CordonedBy.PROVIDER


def gpu_cordon(*, gpu_id: int, reason: str, by: str = "health check",
               source: str = Gpu.CordonedBy.HEALTH) -> bool:
    """Cordon a GPU (no new work is placed on it); True if it changed. Idempotent. An operator's cordon takes over
    a GPU the health check or its provider cordoned (so the provider cannot lift it); other cordons leave a
    cordoned GPU as it is."""
    with transaction.atomic():
        rows = Gpu.objects.filter(pk=gpu_id)
        if source == Gpu.CordonedBy.OPERATOR:
            rows = rows.exclude(health=Gpu.Health.CORDONED, cordoned_by=Gpu.CordonedBy.OPERATOR)
        else:
            rows = rows.exclude(health=Gpu.Health.CORDONED)
        changed = rows.update(health=Gpu.Health.CORDONED, health_reason=f"{reason} ({by})"[:200], cordoned_by=source)
        if changed:
            gpu = Gpu.objects.select_related("node").get(pk=gpu_id)
            detail = {"by": by, "source": source}
            if source == Gpu.CordonedBy.HEALTH:
                detail["causes"] = violation_causes(reason)
            HealthEvent.objects.create(node=gpu.node, gpu=gpu, kind="cordon", message=f"cordoned: {reason}",
                                       detail=detail)
            reliability_refresh_later(node_id=gpu.node_id)
            transaction.on_commit(lambda: announce_node(gpu.node_id, {"gpu": gpu.uuid, "health": "cordoned"}))
    return bool(changed)


def gpu_uncordon(*, gpu_id: int, by: str, source: str) -> bool:
    """Put a GPU back in service; True if it changed. A GPU an operator cordoned is put back only by an operator
    (PermissionDenied for its provider, saying so)."""
    with transaction.atomic():
        rows = Gpu.objects.filter(pk=gpu_id).exclude(health=Gpu.Health.HEALTHY)
        if source != Gpu.CordonedBy.OPERATOR:
            rows = rows.exclude(cordoned_by=Gpu.CordonedBy.OPERATOR)
        # Compare-and-set: an operator's cordon landing at the same moment is not lifted by the provider's click.
        changed = rows.update(health=Gpu.Health.HEALTHY, health_reason="", cordoned_by="")
        gpu = Gpu.objects.select_related("node").get(pk=gpu_id)
        if not changed and gpu.health != Gpu.Health.HEALTHY and gpu.cordoned_by == Gpu.CordonedBy.OPERATOR:
            raise PermissionDenied(f"gpu{gpu.index} was cordoned by an operator ({gpu.health_reason}): only an "
                                   f"operator can put it back in service; contact the operators",
                                   code="cordoned_by_operator")
        if changed:
            HealthEvent.objects.create(node=gpu.node, gpu=gpu, kind="uncordon", message=f"uncordoned by {by}",
                                       detail={"by": by, "source": source})
            transaction.on_commit(lambda: announce_node(gpu.node_id, {"gpu": gpu.uuid, "health": "healthy"}))
            transaction.on_commit(lambda: tell_agent_uncordoned(gpu.node_id, gpu.uuid))
    return bool(changed)


def health_event_record(*, node_id, gpu_uuid: str | None, kind: str, message: str, detail: dict) -> None:
    """Record an agent-reported event (XID, fault); a GPU uuid of another node is ignored."""
    gpu = Gpu.objects.filter(node_id=node_id, uuid=gpu_uuid).first() if gpu_uuid else None
    HealthEvent.objects.create(node_id=node_id, gpu=gpu, kind=kind[:30], message=message[:300], detail=detail)
    if kind == "xid":
        reliability_refresh_later(node_id=node_id)
