"""What idle reclaim and autoscaling do, decided from plain facts: each lease's utilisation per whole minute (from
the GPU metrics rollups) and the time. Pure (no Django): the unit tests give rollups and instants and read the
actions.

A "window of N minutes" is the N whole minutes before now (the minute now is in is not over, so its rollup is
not final). A lease counts in a window only if it ran the whole of it and every minute has a reading: no
reading, no action (nothing is reclaimed or scaled on data that is not there).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

MINUTE = timedelta(minutes=1)


def window(now: datetime, minutes: int) -> list[datetime]:
    """The `minutes` whole minutes before `now` (their starts, UTC, oldest first)."""
    current = now.astimezone(timezone.utc).replace(second=0, microsecond=0)
    return [current - MINUTE * k for k in range(minutes, 0, -1)]


@dataclass(frozen=True)
class LeaseLoad:
    """A running lease and its utilisation (0..100) by minute start."""

    lease: str
    started_at: datetime | None
    util: dict[datetime, float] = field(default_factory=dict)


def window_utils(load: LeaseLoad, minutes: list[datetime]) -> list[float] | None:
    """The lease's utilisation in each of `minutes`; None when it did not run the whole window or a minute has
    no reading."""
    if not minutes or load.started_at is None or load.started_at > minutes[0]:
        return None
    values = [load.util.get(m) for m in minutes]
    return None if any(v is None for v in values) else values


# --- idle reclaim ------------------------------------------------------------------------------------------------

def in_hours(now: datetime, *, start: time, end: time, tz: str) -> bool:
    """Whether `now` falls in the daily hours [start, end) of time zone `tz` (start == end: all day; start after
    end: the hours run past midnight)."""
    if start == end:
        return True
    local = now.astimezone(ZoneInfo(tz)).time()
    return start <= local < end if start < end else (local >= start or local < end)


def hours_end_after(now: datetime, *, start: time, end: time, tz: str) -> datetime | None:
    """When the hours that hold `now` end (UTC); None for all day."""
    if start == end:
        return None
    zone = ZoneInfo(tz)
    local = now.astimezone(zone)
    ends = datetime.combine(local.date(), end, tzinfo=zone)
    if ends <= local:
        ends += timedelta(days=1)
    return ends.astimezone(timezone.utc)


@dataclass(frozen=True)
class ReclaimRule:
    idle_below_pct: float
    idle_minutes: int
    hours_start: time
    hours_end: time
    tz: str
    grace_minutes: int


@dataclass(frozen=True)
class ReclaimStep:
    """`action`: "notice" (idle: warn now, act at `act_at`), "reclaim" (end it now), "cancel" (the notice is off,
    `reason` says why) or "" (nothing to do)."""

    action: str = ""
    reason: str = ""
    util: float | None = None
    act_at: datetime | None = None


def reclaim_decide(*, rule: ReclaimRule, load: LeaseLoad, act_at: datetime | None, now: datetime) -> ReclaimStep:
    """What the policy does to one running lease now; `act_at`: when its pending notice falls due (None: no
    notice given)."""
    inside = in_hours(now, start=rule.hours_start, end=rule.hours_end, tz=rule.tz)
    utils = window_utils(load, window(now, rule.idle_minutes))
    peak = max(utils) if utils is not None else None
    idle = peak is not None and peak < rule.idle_below_pct
    if act_at is not None:
        if not inside:
            return ReclaimStep("cancel", "the reclaim hours are over", peak)
        if peak is None:
            return ReclaimStep("cancel", "no utilisation readings for the whole window", peak)
        if not idle:
            return ReclaimStep("cancel", f"busy again ({peak:.0f}% ≥ {rule.idle_below_pct:g}%)", peak)
        if now >= act_at:
            return ReclaimStep("reclaim", f"idle below {rule.idle_below_pct:g}% (at most {peak:.0f}%) for "
                                          f"{rule.idle_minutes} min and after the notice", peak)
        return ReclaimStep("", "", peak)
    if inside and idle:
        return ReclaimStep("notice", f"idle below {rule.idle_below_pct:g}% (at most {peak:.0f}%) for "
                                     f"{rule.idle_minutes} min", peak, now + timedelta(minutes=rule.grace_minutes))
    return ReclaimStep("", "", peak)


# --- autoscaling -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScaleRule:
    min_leases: int
    max_leases: int
    scale_out_pct: float
    scale_out_minutes: int
    scale_in_pct: float
    scale_in_minutes: int
    scale_out_cooldown_seconds: int
    scale_in_cooldown_seconds: int
    scale_out_queue: int | None = None


@dataclass(frozen=True)
class ScaleStep:
    """`action`: "scale_out", "scale_in" (of `lease`) or "" (nothing; `reason` may say what held it back)."""

    action: str = ""
    reason: str = ""
    util: float | None = None
    lease: str | None = None


def group_utils(members: list[LeaseLoad], minutes: list[datetime]) -> list[float] | None:
    """The group's average utilisation in each of `minutes` over the leases that ran the whole window (None when
    none did)."""
    covered = [u for m in members if (u := window_utils(m, minutes)) is not None]
    if not covered:
        return None
    return [sum(u[i] for u in covered) / len(covered) for i in range(len(minutes))]


def _cooling(last_action_at: datetime | None, seconds: int, now: datetime) -> bool:
    return last_action_at is not None and now < last_action_at + timedelta(seconds=seconds)


def autoscale_decide(*, rule: ScaleRule, members: list[LeaseLoad], count: int, now: datetime,
                     last_action_at: datetime | None, queue_length: int | None = None,
                     queue_reported_at: datetime | None = None) -> ScaleStep:
    """What the rule does now. `members`: the group's running leases; `count`: its open leases (running or still
    being carved). A cooldown counts from the last action of either kind (a refused scale-out too, so a market
    without capacity is not asked every tick); the minimum and maximum hold over utilisation; the scale-out cooldown
    also spaces the leases that keep the minimum."""
    cooling_out = _cooling(last_action_at, rule.scale_out_cooldown_seconds, now)
    cooling_in = _cooling(last_action_at, rule.scale_in_cooldown_seconds, now)
    if count < rule.min_leases:
        if cooling_out:
            return ScaleStep("", f"below the minimum of {rule.min_leases}, in the scale-out cooldown")
        return ScaleStep("scale_out", f"{count} lease(s), below the minimum of {rule.min_leases}")
    if count > rule.max_leases:
        victim = _least_loaded(members, window(now, rule.scale_in_minutes))
        if victim is not None:
            return ScaleStep("scale_in", f"{count} lease(s), above the maximum of {rule.max_leases}", None, victim)
    out_utils = group_utils(members, window(now, rule.scale_out_minutes))
    busy = out_utils is not None and min(out_utils) > rule.scale_out_pct
    avg_out = sum(out_utils) / len(out_utils) if out_utils else None
    queued = (rule.scale_out_queue is not None and queue_length is not None and queue_reported_at is not None
              and queue_reported_at >= now - MINUTE * rule.scale_out_minutes and queue_length >= rule.scale_out_queue)
    if busy or queued:
        why = (f"average utilisation {avg_out:.0f}% above {rule.scale_out_pct:g}% for {rule.scale_out_minutes} min"
               if busy else f"the workload's queue is {queue_length} (≥ {rule.scale_out_queue})")
        if count >= rule.max_leases:
            return ScaleStep("", f"{why}, but at the maximum of {rule.max_leases}", avg_out)
        if cooling_out:
            return ScaleStep("", f"{why}, in the scale-out cooldown", avg_out)
        return ScaleStep("scale_out", why, avg_out)
    in_minutes = window(now, rule.scale_in_minutes)
    in_utils = group_utils(members, in_minutes)
    if in_utils is not None and max(in_utils) < rule.scale_in_pct and count > rule.min_leases:
        avg_in = sum(in_utils) / len(in_utils)
        why = f"average utilisation {avg_in:.0f}% below {rule.scale_in_pct:g}% for {rule.scale_in_minutes} min"
        if cooling_in:
            return ScaleStep("", f"{why}, in the scale-in cooldown", avg_in)
        return ScaleStep("scale_in", why, avg_in, _least_loaded(members, in_minutes))
    return ScaleStep("", "", avg_out)


def _least_loaded(members: list[LeaseLoad], minutes: list[datetime]) -> str | None:
    """The lease to end: the least loaded over the window, the newest among equals (it has the least work in
    flight); a lease without the window's readings counts as idle."""
    if not members:
        return None

    def key(m: LeaseLoad):
        u = window_utils(m, minutes)
        started = m.started_at.timestamp() if m.started_at else float("inf")
        return (round(sum(u) / len(u), 1) if u else 0.0, -started)

    return min(members, key=key).lease
