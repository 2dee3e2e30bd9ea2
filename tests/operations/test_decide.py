"""The decisions of idle reclaim and autoscaling, pure: minute rollups and exact instants in, actions out."""
from __future__ import annotations

from datetime import datetime, time, timedelta, timezone

import pytest

from marketplace.operations.decide import (LeaseLoad, ReclaimRule, ScaleRule, autoscale_decide, hours_end_after,
                                           in_hours, reclaim_decide, window)

UTC = timezone.utc
T0 = datetime(2026, 12, 1, 22, 0, tzinfo=UTC)  # 23:00 in Berlin
M = timedelta(minutes=1)


def load(lease="a", *, started=T0 - 60 * M, utils=(), first=None) -> LeaseLoad:
    """A lease whose readings are `utils`, one a minute from `first` (default: ending with the minute before T0)."""
    first = first or T0 - len(utils) * M
    return LeaseLoad(lease=lease, started_at=started, util={first + i * M: u for i, u in enumerate(utils)})


def test_a_window_is_the_whole_minutes_before_now_and_not_the_one_still_running():
    assert window(T0 + timedelta(seconds=59), 3) == [T0 - 3 * M, T0 - 2 * M, T0 - M]
    assert window(T0, 1) == [T0 - M]


@pytest.mark.parametrize("hhmm,start,end,inside", [
    ("22:59", time(23), time(7), False), ("23:00", time(23), time(7), True), ("03:00", time(23), time(7), True),
    ("07:00", time(23), time(7), False), ("12:00", time(9), time(17), True), ("17:00", time(9), time(17), False),
    ("12:00", time(0), time(0), True)])
def test_reclaim_hours_in_the_policys_time_zone_run_past_midnight_when_they_start_late(hhmm, start, end, inside):
    h, m = map(int, hhmm.split(":"))
    berlin_winter = datetime(2026, 12, 1, h, m, tzinfo=UTC) - timedelta(hours=1)  # CET is UTC+1 in December
    assert in_hours(berlin_winter, start=start, end=end, tz="Europe/Berlin") is inside


def test_the_hours_end_is_the_next_local_end_in_utc():
    assert hours_end_after(T0, start=time(23), end=time(7), tz="Europe/Berlin") == datetime(2026, 12, 2, 6, tzinfo=UTC)
    assert hours_end_after(T0, start=time(0), end=time(0), tz="UTC") is None


RULE = ReclaimRule(idle_below_pct=10, idle_minutes=15, hours_start=time(23), hours_end=time(7), tz="Europe/Berlin",
                   grace_minutes=10)


def test_a_lease_idle_for_the_whole_window_inside_the_hours_gets_a_notice_due_after_the_grace():
    step = reclaim_decide(rule=RULE, load=load(utils=[3.0] * 15), act_at=None, now=T0 + timedelta(seconds=5))
    assert step.action == "notice" and step.act_at == T0 + timedelta(minutes=10, seconds=5) and step.util == 3.0


@pytest.mark.parametrize("why,lease,now", [
    ("one busy minute", load(utils=[3.0] * 14 + [10.0]), T0),
    ("a minute without a reading", load(utils=[3.0] * 14), T0),
    ("started inside the window", load(utils=[3.0] * 15, started=T0 - 15 * M + timedelta(seconds=1)), T0),
    ("outside the hours", load(utils=[3.0] * 15, first=T0 - 16 * M), T0 - 61 * M)])
def test_no_notice_without_a_whole_idle_window_inside_the_hours(why, lease, now):
    assert reclaim_decide(rule=RULE, load=lease, act_at=None, now=now).action == "", why


def test_a_noticed_lease_is_reclaimed_when_the_notice_falls_due_still_idle_and_not_a_second_before():
    due = T0 + 10 * M
    idle = load(utils=[2.0] * 25, first=T0 - 15 * M)
    assert reclaim_decide(rule=RULE, load=idle, act_at=due, now=due - timedelta(seconds=1)).action == ""
    assert reclaim_decide(rule=RULE, load=idle, act_at=due, now=due).action == "reclaim"


def test_a_notice_is_cancelled_when_the_lease_gets_busy_or_the_hours_end():
    due = T0 + 10 * M
    busy = load(utils=[2.0] * 24 + [50.0], first=T0 - 15 * M)
    step = reclaim_decide(rule=RULE, load=busy, act_at=due, now=due)
    assert step.action == "cancel" and "busy again (50%" in step.reason
    morning = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
    idle = load(utils=[2.0] * 30, first=morning - 30 * M)
    assert reclaim_decide(rule=RULE, load=idle, act_at=due, now=morning).reason == "the reclaim hours are over"


SCALE = ScaleRule(min_leases=1, max_leases=3, scale_out_pct=70, scale_out_minutes=2, scale_in_pct=20,
                  scale_in_minutes=3, scale_out_cooldown_seconds=600, scale_in_cooldown_seconds=120,
                  scale_out_queue=10)


def decide(members, *, count=None, last=None, now=T0, **kw):
    return autoscale_decide(rule=SCALE, members=members, count=len(members) if count is None else count, now=now,
                            last_action_at=last, **kw)


def test_an_empty_group_scales_out_to_its_minimum():
    step = decide([], count=0)
    assert step.action == "scale_out" and "below the minimum of 1" in step.reason


def test_a_group_busy_above_the_threshold_every_minute_of_the_window_scales_out():
    step = decide([load("a", utils=[90, 80]), load("b", utils=[60, 70])])
    assert step.action == "scale_out" and step.util == 75.0 and "75% above 70% for 2 min" in step.reason


def test_one_minute_at_or_below_the_threshold_is_not_busy_for_the_window():
    assert decide([load("a", utils=[90, 70])]).action == ""


def test_the_scale_out_cooldown_holds_a_second_scale_out_until_it_is_over():
    busy = [load("a", utils=[90, 90]), load("b", utils=[90, 90])]
    last = T0 - timedelta(seconds=599)
    held = decide(busy, last=last)
    assert held.action == "" and "in the scale-out cooldown" in held.reason
    assert decide(busy, last=last, now=T0 + timedelta(seconds=1)).action == "scale_out"


def test_at_the_maximum_a_busy_group_does_not_grow():
    busy = [load(x, utils=[90, 90]) for x in "abc"]
    assert "at the maximum of 3" in decide(busy).reason and decide(busy).action == ""


def test_a_reported_queue_scales_out_while_the_report_is_fresh():
    idle = [load("a", utils=[50, 50])]
    assert decide(idle, queue_length=10, queue_reported_at=T0 - 2 * M).action == "scale_out"
    assert decide(idle, queue_length=10, queue_reported_at=T0 - 2 * M - timedelta(seconds=1)).action == ""
    assert decide(idle, queue_length=9, queue_reported_at=T0).action == ""


def test_an_idle_group_scales_in_its_least_loaded_lease_then_the_newest_among_equals():
    members = [load("old", utils=[5, 5, 5], started=T0 - 90 * M), load("new", utils=[5, 5, 5], started=T0 - 30 * M),
               load("busier", utils=[10, 10, 30])]
    step = decide(members)
    assert step.action == "scale_in" and step.lease == "new" and "below 20% for 3 min" in step.reason


def test_scale_in_waits_for_its_cooldown_and_never_goes_below_the_minimum():
    idle = [load("a", utils=[5, 5, 5]), load("b", utils=[5, 5, 5])]
    assert decide(idle, last=T0 - timedelta(seconds=119)).action == ""
    assert decide(idle, last=T0 - timedelta(seconds=120)).action == "scale_in"
    assert decide(idle[:1]).action == ""


def test_a_group_above_its_maximum_loses_a_lease_at_once():
    members = [load(x, utils=[50, 50, 50]) for x in "abcd"]
    step = decide(members, last=T0)
    assert step.action == "scale_in" and "above the maximum of 3" in step.reason
