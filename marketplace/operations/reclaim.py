"""Idle reclaim (docs/operations.md, "Idle reclaim"): a buyer's (or one project's) policy "end leases idle below X%
for N minutes during these hours". The beat finds idle leases on the minute rollups, gives each a notice (console,
webhook, e-mail) and ends it through the lifecycle's one end transition when the grace is over and it is still
idle; the log keeps what was reclaimed and the money saved: the rest of the idle hours at the lease's price.

Only metered leases (on demand, spot) are reclaimed: a reserved window is paid already, ending it saves nothing.
A lease of an autoscaling group is its rule's to end, not a policy's. The project's own policy wins over the
buyer's default."""
from __future__ import annotations

import logging
import zoneinfo
from datetime import datetime, time

from django.db import IntegrityError, transaction
from django.utils import timezone

from marketplace import events
from marketplace.amounts import ZERO, cost, usd
from marketplace.lifecycle.alerts import alert_fire, alert_resolve
from marketplace.lifecycle.leases import lease_end
from marketplace.models import Lease, Project, ReclaimNotice, ReclaimPolicy
from marketplace.products.accounts.mail import send_after_commit
from scheduler.errors import Conflict, DomainError, NotFound

from .decide import ReclaimRule, hours_end_after, in_hours, reclaim_decide
from .loads import lease_loads

log = logging.getLogger(__name__)
END_REASON = "idle reclaim"

# --- policies ----------------------------------------------------------------------------------------------------

POLICY_FIELDS = ("enabled", "idle_below_pct", "idle_minutes", "hours_start", "hours_end", "timezone",
                 "grace_minutes", "hold_jobs")


def _check_policy(fields: dict) -> None:
    if not 1 <= fields["idle_below_pct"] <= 100:
        raise DomainError("idle_below_pct is between 1 and 100", field="idle_below_pct")
    if not 1 <= fields["idle_minutes"] <= 1440:
        raise DomainError("idle_minutes is between 1 and 1440", field="idle_minutes")
    if not 0 <= fields["grace_minutes"] <= 1440:
        raise DomainError("grace_minutes is between 0 and 1440", field="grace_minutes")
    for name in ("hours_start", "hours_end"):
        if not isinstance(fields[name], time):
            raise DomainError(f"{name} is a time of day like 22:00", field=name)
    try:
        zoneinfo.ZoneInfo(fields["timezone"])
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        raise DomainError(f"{fields['timezone']!r} is not a time zone (like Europe/Berlin or UTC)",
                          field="timezone") from None


def _project(*, user, project_id) -> Project | None:
    if project_id in (None, ""):
        return None
    project = Project.objects.filter(pk=project_id, user=user).first()
    if project is None:
        raise NotFound("no such project among yours", field="project")
    return project


def reclaim_policy_save(*, user, project_id=None, policy_id=None, **fields) -> ReclaimPolicy:
    """Create the user's policy for the project (or the default, no project), or update `policy_id`; one policy per
    project and one default (Conflict otherwise)."""
    defaults = {"enabled": True, "idle_below_pct": 5, "idle_minutes": 30, "grace_minutes": 10, "timezone": "UTC",
                "hold_jobs": True}
    if policy_id is not None:
        policy = ReclaimPolicy.objects.filter(pk=policy_id, user=user).first()
        if policy is None:
            raise NotFound("no such reclaim policy among yours")
        merged = {name: getattr(policy, name) for name in POLICY_FIELDS} | fields
    else:
        policy = ReclaimPolicy(user=user, project=_project(user=user, project_id=project_id))
        merged = defaults | fields
    missing = [n for n in POLICY_FIELDS if n not in merged]
    if missing:
        raise DomainError(f"{missing[0]} is required", field=missing[0])
    _check_policy(merged)
    for name in POLICY_FIELDS:
        setattr(policy, name, merged[name])
    try:
        with transaction.atomic():
            policy.save()
    except IntegrityError:
        raise Conflict("this project (or your account's default) has a reclaim policy already: edit it",
                       code="policy_exists", field="project") from None
    return policy


def reclaim_policy_delete(*, user, policy_id) -> None:
    deleted, _ = ReclaimPolicy.objects.filter(pk=policy_id, user=user).delete()
    if not deleted:
        raise NotFound("no such reclaim policy among yours")


# --- the beat ----------------------------------------------------------------------------------------------------

def _rule(policy: ReclaimPolicy) -> ReclaimRule:
    return ReclaimRule(idle_below_pct=policy.idle_below_pct, idle_minutes=policy.idle_minutes,
                       hours_start=policy.hours_start, hours_end=policy.hours_end, tz=policy.timezone,
                       grace_minutes=policy.grace_minutes)


def _covered_leases(policy: ReclaimPolicy) -> list[Lease]:
    """The running metered leases the policy covers: its project's, or (the default) the buyer's leases whose
    project has no policy of its own; never an autoscaling group's."""
    qs = (Lease.objects.filter(buyer_id=policy.user_id, state=Lease.State.RUNNING, metered=True)
          .exclude(order__autoscale_actions__isnull=False).select_related("slice__gpu", "order"))
    if policy.project_id is not None:
        return list(qs.filter(order__project_id=policy.project_id))
    own = ReclaimPolicy.objects.filter(user_id=policy.user_id, project__isnull=False).values("project_id")
    return list(qs.exclude(order__project_id__in=own))


def reclaim_tick(*, now: datetime | None = None) -> int:
    """Beat: notice, reclaim or cancel per policy and lease. Returns how many leases were reclaimed."""
    now = now or timezone.now()
    reclaimed = 0
    ReclaimPolicy.objects.filter(enabled=False, holding_until__isnull=False).update(holding_until=None)
    for policy in ReclaimPolicy.objects.filter(enabled=True).select_related("user"):
        rule = _rule(policy)
        _hold_jobs(policy, now=now)
        leases = _covered_leases(policy)
        pending = {str(n.lease_id): n for n in policy.notices.filter(state=ReclaimNotice.State.PENDING)}
        loads = lease_loads(leases=leases, now=now, minutes=policy.idle_minutes)
        for lease in leases:
            notice = pending.pop(str(lease.pk), None)
            step = reclaim_decide(rule=rule, load=loads[str(lease.pk)], act_at=notice.act_at if notice else None,
                                  now=now)
            if step.action == "notice":
                _notice(policy, lease, step, now=now)
            elif step.action == "reclaim":
                reclaimed += _reclaim(notice, lease, step, now=now)
            elif step.action == "cancel":
                _cancel(notice, step.reason, now=now)
        for notice in pending.values():  # its lease ended otherwise, or left the policy's scope
            _cancel(notice, "the lease is no longer running under this policy", now=now)
    # Notices of policies switched off or deleted meanwhile.
    for notice in ReclaimNotice.objects.filter(state=ReclaimNotice.State.PENDING, policy__enabled=False):
        _cancel(notice, "the policy was switched off", now=now)
    return reclaimed


def _hold_jobs(policy: ReclaimPolicy, *, now: datetime) -> None:
    """Inside bounded hours, queued job orders of the policy's scope wait for their end (products.orders reads
    holding_until); outside them, or for a policy of all day, nothing is held."""
    until = None
    if policy.hold_jobs and in_hours(now, start=policy.hours_start, end=policy.hours_end, tz=policy.timezone):
        until = hours_end_after(now, start=policy.hours_start, end=policy.hours_end, tz=policy.timezone)
    if until != policy.holding_until:
        ReclaimPolicy.objects.filter(pk=policy.pk).update(holding_until=until)


def _payload(notice: ReclaimNotice, kind: str) -> dict:
    return {"type": kind, "lease": str(notice.lease_id), "state": notice.state, "act_at": notice.act_at.isoformat(),
            "util_pct": round(notice.util_pct, 1), "reason": notice.reason, "saved": str(notice.saved)}


def _notice(policy: ReclaimPolicy, lease: Lease, step, *, now: datetime) -> None:
    try:
        with transaction.atomic():
            notice = ReclaimNotice.objects.create(policy=policy, lease=lease, noticed_at=now, act_at=step.act_at,
                                                  util_pct=step.util, reason=step.reason[:200])
    except IntegrityError:  # another beat noticed it first (one pending notice per lease)
        return
    with transaction.atomic():
        payload = _payload(notice, "reclaim_notice")
        events.tell_buyer(policy.user_id, payload)
        # Sent as a lease_ended kind: the account's switch for "a lease ends" covers its advance notice.
        events.notify_webhook(user_id=policy.user_id, kind="lease_ended", payload=payload,
                              order_webhook=lease.order.webhook_url if lease.order_id else "")
        if policy.user.email:
            send_after_commit(template="reclaim_notice", to=policy.user.email,
                              context={"notice": notice, "lease": lease, "policy": policy,
                                       "price": usd(lease.price_per_hour)})
        # The bell and the account's alerts webhook too; the e-mail above already says it (no second mail).
        alert_fire(user=policy.user, kind="other", subject_key=_alert_key(lease), lease=lease, email=False,
                   title=f"Idle lease {str(lease.pk)[:8]} will be ended at {notice.act_at:%H:%M} UTC",
                   detail=f"{notice.reason}. It ends then unless it gets busy; the policy's hours and threshold "
                          "are on the Operations page.", now=now)


def _alert_key(lease: Lease) -> str:
    return f"reclaim:{lease.pk}"


def saved_for(*, lease: Lease, policy: ReclaimPolicy, at: datetime) -> tuple:
    """What ending `lease` at `at` saves: its price over the rest of the reclaim hours (or to its own end, if
    sooner); a policy for all day counts to the lease's end, or nothing when it has none (an open-ended lease's
    future is not a saving anyone can state)."""
    until = hours_end_after(at, start=policy.hours_start, end=policy.hours_end, tz=policy.timezone)
    if lease.ends_at is not None:
        until = min(until, lease.ends_at) if until is not None else lease.ends_at
    if until is None or until <= at:
        return ZERO, until
    return cost(per_hour=lease.price_per_hour, seconds=(until - at).total_seconds()), until


def _reclaim(notice: ReclaimNotice, lease: Lease, step, *, now: datetime) -> int:
    with transaction.atomic():
        # Lock the notice: the race is two beats acting on it at once; the second finds it reclaimed.
        notice = ReclaimNotice.objects.select_for_update().filter(pk=notice.pk, state=ReclaimNotice.State.PENDING
                                                                  ).first()
        if notice is None:
            return 0
        ended = lease_end(lease_id=lease.pk, reason=END_REASON, at=now)
        if ended.end_reason != END_REASON:  # it ended otherwise under us
            notice.state, notice.acted_at, notice.reason = ReclaimNotice.State.CANCELLED, now, "ended otherwise"
            notice.save(update_fields=["state", "acted_at", "reason"])
            return 0
        notice.saved, notice.saved_until = saved_for(lease=lease, policy=notice.policy, at=now)
        notice.state, notice.acted_at, notice.util_pct = ReclaimNotice.State.RECLAIMED, now, step.util
        notice.reason = step.reason[:200]
        notice.save(update_fields=["saved", "saved_until", "state", "acted_at", "util_pct", "reason"])
        events.tell_buyer(lease.buyer_id, _payload(notice, "lease_reclaimed"))
        alert_resolve(user=lease.buyer, subject_key=_alert_key(lease), now=now)
    return 1


def _cancel(notice: ReclaimNotice, reason: str, *, now: datetime) -> None:
    with transaction.atomic():
        changed = ReclaimNotice.objects.filter(pk=notice.pk, state=ReclaimNotice.State.PENDING).update(
            state=ReclaimNotice.State.CANCELLED, acted_at=now, reason=reason[:200])
        if changed:
            notice.refresh_from_db()
            events.tell_buyer(notice.policy.user_id, _payload(notice, "reclaim_cancelled"))
            alert_resolve(user=notice.policy.user, subject_key=_alert_key(notice.lease), now=now)
