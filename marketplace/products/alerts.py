"""Alert rules and their evaluation (docs/operations.md "Alerts"): the beat runs `alerts_evaluate` once a minute on
the GPU metrics rollups (one row per GPU per minute), the projects' spend and the wallets' burn rate, and raises or
resolves alerts through lifecycle.alerts (de-duplicated there).

Which rule applies: the narrowest one of the kind (the lease's, else its project's, else the account's); with none
the seed's defaults (RULE_DEFAULTS) apply, e-mail on. A rule switched off raises nothing within its reach.

Metrics come per GPU: a lease's slice is judged on its GPU's minutes only while it is the only slice on that GPU
(a whole GPU, or a MIG slice alone on it); slices sharing a GPU are not judged until the agent reports each MIG
instance apart (the GPU's memory and utilisation would be their sum)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from marketplace.lifecycle.alerts import alert_fire, alert_resolve
from marketplace.metering import minute_of, wallet_runways
from marketplace.models import Alert, AlertKind, AlertRule, Lease, Project
from marketplace.money.statements import cents, month_of, projects_spend
from marketplace.pricing import price_for, spot_factor_for
from nodeagent.hardware import mig as core_mig
from scheduler.core import pricing as core_pricing
from scheduler.errors import Conflict, DomainError, NotFound
from scheduler.models import Gpu, GpuMetricRollup, Node, Slice
from scheduler.services.health import Thresholds

K = AlertKind
# The seed's defaults (000_* §3.3): utilisation under 30% for 15 minutes; memory at 95% of the slice; spend at 50, 80
# and 100% of the monthly budget; a wallet that runs out within 24 hours. GPU health uses the fleet's thresholds.
RULE_DEFAULTS: dict[str, dict] = {
    K.UNDERUSED: {"util_below_percent": 30, "minutes": 15},
    K.OOM_RISK: {"memory_percent": 95},
    K.GPU_HEALTH: {},
    K.SPEND: {"percents": [50, 80, 100]},
    K.WALLET_RUNWAY: {"hours": 24},
}
RULE_KINDS = tuple(RULE_DEFAULTS)
# Each parameter: (lowest, highest) it may take.
PARAM_LIMITS = {"util_below_percent": (1, 100), "minutes": (1, 1440), "memory_percent": (50, 100),
                "hours": (1, 24 * 30)}
HOUR = timedelta(hours=1)


# --- rules ---------------------------------------------------------------------------------------------------------

def rule_params_clean(kind: str, params: dict | None) -> dict:
    """The kind's parameters, each checked and the missing ones filled from the defaults; DomainError naming a
    bad one."""
    if kind not in RULE_DEFAULTS:
        raise DomainError(f"unknown alert kind {kind!r}; one of {', '.join(RULE_KINDS)}", field="kind")
    params = dict(params or {})
    unknown = set(params) - set(RULE_DEFAULTS[kind])
    if unknown:
        raise DomainError(f"a {kind} rule has no parameter {sorted(unknown)[0]!r}"
                          + (f"; it takes {', '.join(RULE_DEFAULTS[kind])}" if RULE_DEFAULTS[kind] else ""),
                          field="params")
    out = {**RULE_DEFAULTS[kind], **params}
    for name, value in out.items():
        if name == "percents":
            if (not isinstance(value, list) or not value or len(value) > 10
                    or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1000 for v in value)):
                raise DomainError("percents is a list of 1 to 10 whole percentages of the budget, 1 to 1000",
                                  field="params")
            out[name] = sorted(set(value))
            continue
        low, high = PARAM_LIMITS[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise DomainError(f"{name} is a number from {low} to {high}", field="params")
    return out


def _reach(*, user, project_id=None, lease_id=None) -> tuple[Project | None, Lease | None]:
    if project_id is not None and lease_id is not None:
        raise DomainError("a rule is for a project or for a lease, not both", field="project")
    project = lease = None
    if project_id is not None:
        project = Project.objects.filter(pk=project_id, user=user).first()
        if project is None:
            raise NotFound("no such project", field="project")
    if lease_id is not None:
        lease = Lease.objects.filter(pk=lease_id, buyer=user).first()
        if lease is None:
            raise NotFound("no such lease", field="lease")
    return project, lease


def rule_create(*, user, kind: str, params: dict | None = None, project_id=None, lease_id=None,
                enabled: bool = True, email: bool = True) -> AlertRule:
    """A rule of `kind` for the account, one project or one lease (one per reach and kind)."""
    params = rule_params_clean(kind, params)
    project, lease = _reach(user=user, project_id=project_id, lease_id=lease_id)
    try:
        with transaction.atomic():
            return AlertRule.objects.create(user=user, kind=kind, params=params, project=project, lease=lease,
                                            enabled=enabled, email=email)
    except IntegrityError:  # the unique constraints also cover two creates at once
        where = f"project {project.name!r}" if project else f"lease {str(lease.pk)[:8]}" if lease else "the account"
        raise Conflict(f"{where} already has a {kind} rule; change that one", code="rule_exists") from None


def rule_update(*, rule: AlertRule, params: dict | None = None, enabled: bool | None = None,
                email: bool | None = None) -> AlertRule:
    """Change a rule's parameters (checked), or switch it or its e-mail on or off."""
    if params is not None:
        rule.params = rule_params_clean(rule.kind, {**rule.params, **params})
    if enabled is not None:
        rule.enabled = enabled
    if email is not None:
        rule.email = email
    rule.save(update_fields=["params", "enabled", "email", "updated_at"])
    return rule


def rule_set(*, user, kind: str, params: dict, project_id=None, enabled: bool = True,
             email: bool = True) -> AlertRule:
    """The console's save: the account's (or the project's) rule of `kind` made or changed to these values."""
    rule = AlertRule.objects.filter(user=user, kind=kind, project_id=project_id, lease=None).first()
    if rule is None:
        return rule_create(user=user, kind=kind, params=params, project_id=project_id, enabled=enabled, email=email)
    rule.params = {}
    return rule_update(rule=rule, params=params, enabled=enabled, email=email)


def rule_delete(*, rule: AlertRule) -> None:
    """Forget a rule: the next wider one (or the defaults) applies again."""
    rule.delete()


def rules_effective(*, user) -> list[dict]:
    """The account-wide setting of every kind, as the rules page shows it: the user's rule or the defaults."""
    mine = {r.kind: r for r in AlertRule.objects.filter(user=user, project=None, lease=None)}
    return [{"kind": kind, "label": K(kind).label, "rule": mine.get(kind),
             "params": mine[kind].params if kind in mine else RULE_DEFAULTS[kind]} for kind in RULE_KINDS]


@dataclass(frozen=True)
class Setting:
    params: dict
    enabled: bool = True
    email: bool = True


class Rules:
    """The rules of a set of users, read once; `for_(...)` picks the narrowest that applies."""

    def __init__(self, user_ids, kinds):
        self._by = {}
        for r in AlertRule.objects.filter(user_id__in=set(user_ids), kind__in=kinds):
            self._by[(r.user_id, r.kind, r.project_id, r.lease_id)] = r

    def for_(self, *, user_id, kind: str, project_id=None, lease_id=None) -> Setting:
        reaches = ([(None, lease_id)] if lease_id else []) + ([(project_id, None)] if project_id else []) + [(None, None)]
        for project, lease in reaches:
            rule = self._by.get((user_id, kind, project, lease))
            if rule is not None:
                return Setting({**RULE_DEFAULTS[kind], **rule.params}, rule.enabled, rule.email)
        return Setting(dict(RULE_DEFAULTS[kind]))


# --- evaluation ----------------------------------------------------------------------------------------------------

def alerts_evaluate(*, now: datetime | None = None) -> dict[str, int]:
    """Raise and resolve every kind's alerts as of `now` (the beat: once a minute). Returns what it fired per kind."""
    now = now or timezone.now()
    fired = {}
    fired.update(_lease_metrics(now))
    fired[K.GPU_HEALTH] = _gpu_health(now)
    fired[K.SPEND] = _spend(now)
    fired[K.WALLET_RUNWAY] = _runway(now)
    return fired


def _slice_memory_mib(sl: Slice, geometry) -> float:
    if sl.profile and geometry is not None and geometry.has_profile(sl.profile):
        return geometry.profile(sl.profile).memory_gb * 1024
    return float(sl.gpu.memory_mib)


def _price(lease: Lease, *, geometry, profile: str | None) -> Decimal:
    mode = lease.mode if lease.mode in core_pricing.MODES else "on_demand"
    factor = spot_factor_for(model=lease.slice.gpu.gpu_model.key) if mode == "spot" else None
    return price_for(mode=mode, base_per_gpu_hour=lease.slice.gpu.node.price_per_gpu_hour, geometry=geometry,
                     profile=profile, spot_factor=factor)


def _reference_geometry(gpu: Gpu):
    return gpu.geometry() or (gpu.gpu_model.geometry() if gpu.gpu_model_id else None)


def smaller_profile(lease: Lease, minutes: list) -> dict | None:
    """The smallest MIG profile that would have held the last hour's peak memory and utilisation of the lease's
    slice, when it is smaller than the slice, with the price per hour it saves; None otherwise."""
    gpu = lease.slice.gpu
    geometry = _reference_geometry(gpu)
    if geometry is None:
        return None
    current = geometry.profile(lease.slice.profile) if lease.slice.profile and geometry.has_profile(
        lease.slice.profile) else geometry.full_profile
    peak_mem = max((r.mem_used_max or 0.0 for r in minutes), default=0.0) / 1024
    peak_util = max((r.util_max or 0.0 for r in minutes), default=0.0)
    compute = max(1, math.ceil(peak_util / 100 * current.compute_slices - 1e-9))
    fit = core_mig.smallest_fitting_profile(geometry, memory_gb=peak_mem, compute_slices=compute)
    if fit is None or (fit.memory_slices, fit.compute_slices) >= (current.memory_slices, current.compute_slices):
        return None
    now_price = _price(lease, geometry=gpu.geometry(), profile=lease.slice.profile or None)
    then_price = _price(lease, geometry=geometry, profile=fit.name)
    saves = now_price - then_price
    return {"profile": fit.name, "price_per_hour": str(then_price), "current_price_per_hour": str(now_price),
            "saves_per_hour": str(saves),
            "text": f"{fit.name} would have held the last hour's peak ({peak_mem:.1f} GB, {peak_util:.0f}% busy) "
                    f"for ${cents(then_price)}/h instead of ${cents(now_price)}/h: ${cents(saves)}/h less."}


def larger_profile(lease: Lease) -> dict | None:
    """The next larger MIG profile than the lease's slice (more memory), with its price per hour; None for a whole
    GPU or the largest profile."""
    gpu = lease.slice.gpu
    geometry = gpu.geometry()
    if geometry is None or not lease.slice.profile or not geometry.has_profile(lease.slice.profile):
        return None
    current = geometry.profile(lease.slice.profile)
    bigger = [p for p in geometry.profiles if p.memory_gb > current.memory_gb and not p.media_extensions]
    if not bigger:
        return None
    nxt = min(bigger, key=lambda p: (p.memory_gb, p.compute_slices))
    price = _price(lease, geometry=geometry, profile=nxt.name)
    now_price = _price(lease, geometry=geometry, profile=current.name)
    return {"profile": nxt.name, "price_per_hour": str(price), "current_price_per_hour": str(now_price),
            "extra_per_hour": str(price - now_price),
            "text": f"{nxt.name} ({nxt.memory_gb:g} GB) for ${cents(price)}/h, ${cents(price - now_price)}/h more."}


def _resolve_cleared(kinds: list[str], keep: set, now: datetime) -> None:
    """Resolve the firing alerts of `kinds` whose (user id, subject key) this pass did not keep: the condition
    cleared, the rule was switched off, the lease ended. Resolving costs a locked read, so only what is firing is
    looked at (not every quiet subject every minute)."""
    for alert in Alert.objects.filter(kind__in=kinds, state=Alert.State.FIRING).select_related("user"):
        if (alert.user_id, alert.subject_key) not in keep:
            alert_resolve(user=alert.user, subject_key=alert.subject_key, now=now)


def _lease_metrics(now: datetime) -> dict[str, int]:
    """Underused and OOM-risk alerts of running leases, on their GPU's complete minutes before `now`."""
    current = minute_of(now)
    leases = list(Lease.objects.filter(state=Lease.State.RUNNING)
                  .select_related("slice__gpu__gpu_model", "slice__gpu__node", "order", "buyer"))
    gpu_ids = {lease.slice.gpu_id for lease in leases}
    sharing = dict(Slice.objects.filter(gpu_id__in=gpu_ids, state__in=Slice.ACTIVE_STATES).order_by()
                   .values("gpu_id").annotate(n=Count("id")).values_list("gpu_id", "n"))
    minutes: dict[int, dict[datetime, GpuMetricRollup]] = {}
    for r in GpuMetricRollup.objects.filter(gpu_id__in=gpu_ids, minute__gte=current - HOUR, minute__lt=current):
        minutes.setdefault(r.gpu_id, {})[r.minute] = r
    rules = Rules({lease.buyer_id for lease in leases}, [K.UNDERUSED, K.OOM_RISK])
    fired = {K.UNDERUSED: 0, K.OOM_RISK: 0}
    keep = set()
    last = current - timedelta(minutes=1)
    for lease in leases:
        if sharing.get(lease.slice.gpu_id, 0) > 1:
            continue  # the GPU's numbers are several slices' sum (module doc)
        rows = minutes.get(lease.slice.gpu_id, {})
        project_id = lease.order.project_id if lease.order_id else None
        for kind in (K.UNDERUSED, K.OOM_RISK):
            setting = rules.for_(user_id=lease.buyer_id, kind=kind, project_id=project_id, lease_id=lease.pk)
            key = f"{kind}:lease:{lease.pk}"
            keep.add((lease.buyer_id, key))
            if not setting.enabled:
                keep.discard((lease.buyer_id, key))  # resolved below, if firing
                continue
            if kind == K.UNDERUSED:
                state = _underused(lease, rows, current, setting.params)
            else:
                state = _oom(lease, rows.get(last), setting.params)
            if state is None:
                continue  # nothing new known (no minute reported): the alert stays as it is
            if state is False:
                keep.discard((lease.buyer_id, key))
                continue
            title, detail, suggestion = state
            _, opened = alert_fire(user=lease.buyer, kind=kind, subject_key=key, title=title, detail=detail,
                                   severity="info" if kind == K.UNDERUSED else "warning", suggestion=suggestion,
                                   lease=lease, email=setting.email, now=now)
            fired[kind] += opened
    _resolve_cleared([K.UNDERUSED, K.OOM_RISK], keep, now)
    return fired


def _underused(lease: Lease, rows: dict, current: datetime, params: dict):
    """(title, detail, suggestion) while every one of the last `minutes` complete minutes was under the threshold;
    False once the latest minute is at or over it; None when it cannot tell (minutes missing, no utilisation)."""
    n, below = int(params["minutes"]), float(params["util_below_percent"])
    window = [current - timedelta(minutes=i) for i in range(n, 0, -1)]
    latest = rows.get(window[-1])
    if latest is not None and latest.util_avg is not None and latest.util_avg >= below:
        return False
    if lease.started_at is None or lease.started_at > window[0]:
        return None
    if any(rows.get(m) is None or rows[m].util_avg is None or rows[m].util_avg >= below for m in window):
        return None
    avg = sum(rows[m].util_avg for m in window) / n
    suggestion = smaller_profile(lease, list(rows.values()))
    name = lease.slice.profile or "whole GPU"
    return (f"Lease {str(lease.pk)[:8]} ({name}) is underused: {avg:.0f}% busy over {n} minutes",
            f"Its GPU stayed under {below:g}% utilisation for the last {n} minutes. You pay for the whole slice "
            f"while it runs.", suggestion)


def _oom(lease: Lease, latest, params: dict):
    if latest is None or latest.mem_used_max is None:
        return None
    limit = _slice_memory_mib(lease.slice, lease.slice.gpu.geometry())
    share = latest.mem_used_max / limit * 100
    if share < float(params["memory_percent"]):
        return False
    name = lease.slice.profile or "whole GPU"
    return (f"Lease {str(lease.pk)[:8]} ({name}) is close to running out of GPU memory: {share:.0f}% used",
            f"It used {latest.mem_used_max / 1024:.1f} of {limit / 1024:.1f} GB in the minute from "
            f"{latest.minute:%H:%M} UTC; at the limit the next allocation fails (out of memory).",
            larger_profile(lease))


def _health_reasons(gpu: Gpu, latest, thresholds: Thresholds) -> list[str]:
    reasons = []
    if gpu.health == Gpu.Health.CORDONED and gpu.cordoned_by == Gpu.CordonedBy.HEALTH:
        reasons.append(gpu.health_reason or "cordoned by the health check")
    if latest is not None:
        if latest.temp_max is not None and latest.temp_max >= thresholds.max_temperature_c:
            reasons.append(f"temperature {latest.temp_max:.0f} °C ≥ {thresholds.max_temperature_c:.0f} °C")
        tdp = gpu.gpu_model.tdp_w if gpu.gpu_model_id else None
        # Every sample of the minute over the limit (its minimum): a sustained draw, not a boost transient.
        if tdp and latest.power_min is not None and latest.power_min > thresholds.power_share * tdp:
            reasons.append(f"power {latest.power_min:.0f} W > {thresholds.power_share:g} × TDP {tdp} W for a minute")
    return reasons


def _gpu_health(now: datetime) -> int:
    """GPU health alerts to the GPU's provider and the buyers of its open leases: a GPU cordoned by the health check
    (temperature, power, ECC, XID), or whose latest complete minute passed the temperature or power threshold."""
    thresholds = Thresholds.from_settings()
    last = minute_of(now) - timedelta(minutes=1)
    hot = set(GpuMetricRollup.objects.filter(minute=last).filter(
        Q(temp_max__gte=thresholds.max_temperature_c)
        | Q(power_min__gt=F("gpu__gpu_model__tdp_w") * thresholds.power_share)).values_list("gpu_id", flat=True))
    gpus = (Gpu.objects.filter(present=True).exclude(node__status=Node.Status.DELETED)
            .filter(Q(health=Gpu.Health.CORDONED, cordoned_by=Gpu.CordonedBy.HEALTH) | Q(pk__in=hot))
            .select_related("node__provider", "gpu_model"))
    latest = {r.gpu_id: r for r in GpuMetricRollup.objects.filter(minute=last, gpu_id__in=hot)}
    bad = {}
    for gpu in gpus:
        reasons = _health_reasons(gpu, latest.get(gpu.pk), thresholds)
        if reasons:
            bad[gpu.pk] = (gpu, reasons)
    holders: dict[int, list[Lease]] = {}
    for lease in Lease.objects.filter(slice__gpu_id__in=list(bad), state__in=Lease.OPEN_STATES).select_related(
            "buyer", "slice"):
        holders.setdefault(lease.slice.gpu_id, []).append(lease)
    users = {g.node.provider_id for g, _ in bad.values()} | {l.buyer_id for ls in holders.values() for l in ls}
    rules = Rules(users, [K.GPU_HEALTH])
    fired, keep = 0, set()
    for gpu_id, (gpu, reasons) in bad.items():
        key = f"gpu_health:gpu:{gpu_id}"
        where = f"{gpu.node.name}/gpu{gpu.index} ({gpu.name})"
        told = [(gpu.node.provider, None,
                 f"GPU {where} needs attention: {reasons[0]}",
                 "Over the health thresholds: " + "; ".join(reasons) + ". A cordoned GPU takes no new work; "
                 "check its cooling, power and the driver's XID log, then put it back in service on the node page.")]
        told += [(lease.buyer, lease, f"The GPU of lease {str(lease.pk)[:8]} is unhealthy: {reasons[0]}",
                  "Its provider is told. A GPU that stays unhealthy may have your lease moved or ended; "
                  "save your work.") for lease in holders.get(gpu_id, [])]
        for user, lease, title, detail in told:
            setting = rules.for_(user_id=user.pk, kind=K.GPU_HEALTH)
            if not setting.enabled:
                continue
            keep.add((user.pk, key))
            _, opened = alert_fire(user=user, kind=K.GPU_HEALTH, subject_key=key, title=title, detail=detail,
                                   severity="critical", lease=lease, email=setting.email, now=now)
            fired += opened
    _resolve_cleared([K.GPU_HEALTH], keep, now)
    return fired


def _spend(now: datetime) -> int:
    """A project's month-to-date spend (UTC month) at each of its rule's percentages of its monthly budget: the
    highest reached fires (once a month), the lower ones it passed resolve; a new month starts them over."""
    month = month_of(now)  # the UTC month projects_spend sums
    projects = list(Project.objects.filter(monthly_budget__isnull=False).select_related("user"))
    rules = Rules({p.user_id for p in projects}, [K.SPEND])
    spends = projects_spend(project_ids=[p.pk for p in projects], at=now)
    fired, keep = 0, set()
    for project in projects:
        setting = rules.for_(user_id=project.user_id, kind=K.SPEND, project_id=project.pk)
        if not setting.enabled:
            continue
        spend = spends[project.pk]
        budget = project.monthly_budget
        reached = [p for p in setting.params["percents"] if spend >= budget * p / 100]
        if not reached:
            continue
        top = max(reached)
        key = f"spend:project:{project.pk}:{month}:{top}"
        keep.add((project.user_id, key))
        severity = "critical" if top >= 100 else "warning" if top >= 80 else "info"
        capped = project.budget_cap == Project.BudgetCap.HARD and top >= 100
        _, opened = alert_fire(
            user=project.user, kind=K.SPEND, subject_key=key, project=project, severity=severity,
            email=setting.email, now=now,
            title=f"Project {project.name} has spent {top}% of its {month} budget",
            detail=f"${cents(spend)} of ${cents(budget)} this month (UTC). "
                   + ("It is at its hard cap: new orders are refused and on-demand leases end."
                      if capped else "Its budget is soft: nothing is stopped."))
        fired += opened
    _resolve_cleared([K.SPEND], keep, now)
    return fired


def _runway(now: datetime) -> int:
    """A wallet that runs out within the rule's hours at the current burn rate of its running leases."""
    runways = wallet_runways(now=now)
    users = get_user_model().objects.in_bulk(list(runways))
    rules = Rules(runways, [K.WALLET_RUNWAY])
    key = "wallet_runway:wallet"
    fired, keep = 0, set()
    for user_id, runway in runways.items():
        setting = rules.for_(user_id=user_id, kind=K.WALLET_RUNWAY)
        hours = float(setting.params["hours"])
        if not setting.enabled or runway.seconds_left >= hours * 3600:
            continue
        keep.add((user_id, key))
        left_h = max(0.0, runway.seconds_left / 3600)
        _, opened = alert_fire(
            user=users[user_id], kind=K.WALLET_RUNWAY, subject_key=key, severity="critical" if left_h < 1 else "warning",
            email=setting.email, now=now,
            title=f"Your wallet runs out in about {_duration(left_h)}",
            detail=f"${cents(runway.balance)} left at ${cents(runway.burn_per_hour)}/h for your running leases "
                   f"(alert under {hours:g} h). Top up, or metered leases stop when it is empty.")
        fired += opened
    _resolve_cleared([K.WALLET_RUNWAY], keep, now)
    return fired


def _duration(hours: float) -> str:
    return f"{hours:.1f} hours" if hours >= 1 else f"{max(1, round(hours * 60))} minutes"


# --- reads ---------------------------------------------------------------------------------------------------------

def alert_list(*, user, state: str | None = None):
    qs = Alert.objects.filter(user=user)
    return qs.filter(state=state) if state else qs


def alerts_firing_count(*, user) -> int:
    return Alert.objects.filter(user=user, state=Alert.State.FIRING).count()

