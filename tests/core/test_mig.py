"""MIG geometry rules from NVIDIA's MIG user guide (placements, counts, compute slices), for A100 and A30."""
from __future__ import annotations

import pytest

from nodeagent.hardware import mig
from nodeagent.hardware.mig import A30_24GB, A100_40GB, A100_80GB, H100_80GB, H200_141GB, Instance


def legal(geometry, placed, profile, start):
    return mig.why_not(geometry, [Instance(p, s) for p, s in placed], profile, start) is None


def test_on_an_a100_a_4g_at_0_and_a_3g_at_4_fit_together():
    assert legal(A100_40GB, [("4g.20gb", 0)], "3g.20gb", 4)
    assert mig.layout_problems(A100_40GB, [Instance("4g.20gb", 0), Instance("3g.20gb", 4)]) == []


def test_a_second_3g_does_not_fit_after_a_4g():
    placed = [Instance("4g.20gb", 0), Instance("3g.20gb", 4)]
    assert mig.legal_starts(A100_40GB, placed, "3g.20gb") == []
    assert not legal(A100_40GB, [("4g.20gb", 0), ("3g.20gb", 4)], "3g.20gb", 0)


def test_seven_1g_fit_and_an_eighth_does_not():
    placed: list[Instance] = []
    for s in range(7):
        assert mig.why_not(A100_80GB, placed, "1g.10gb", s) is None
        placed.append(Instance("1g.10gb", s))
    assert mig.legal_starts(A100_80GB, placed, "1g.10gb") == []
    assert mig.free_capacity(A100_80GB, placed) == (1, 0)


@pytest.mark.parametrize("profile,start,reaches_slot_7", [
    ("1g.20gb", 6, True),   # the 2-slice 1g
    ("3g.40gb", 4, True),
    ("7g.80gb", 0, True),
    ("2g.20gb", 4, False),  # 2g starts stop at 4: slices 4-5
    ("4g.40gb", 0, False),
    ("1g.10gb", 6, False),  # one slice: only slice 6
])
def test_slot_7_is_reachable_only_by_a_2_slice_1g_at_6_a_3g_at_4_or_the_7g(profile, start, reaches_slot_7):
    p = A100_80GB.profile(profile)
    assert start in p.starts
    assert (start + p.memory_slices - 1 >= 7) is reaches_slot_7


def test_no_profile_starts_at_slot_7():
    assert all(7 not in p.starts for p in A100_80GB.profiles)


@pytest.mark.parametrize("placed,profile,start,words", [
    ([("3g.40gb", 4)], "2g.20gb", 4, "overlaps"),
    ([("4g.40gb", 0)], "1g.10gb", 3, "overlaps"),
    ([("7g.80gb", 0)], "1g.10gb", 6, "overlaps"),
    ([("1g.20gb", 6)], "1g.10gb", 6, "overlaps"),
    ([], "3g.40gb", 2, "cannot start at memory slice 2"),
    ([], "1g.10gb", 7, "cannot start at memory slice 7"),
    ([], "5g.50gb", 0, "unknown MIG profile"),
])
def test_illegal_placements_are_refused_with_a_reason(placed, profile, start, words):
    reason = mig.why_not(A100_80GB, [Instance(p, s) for p, s in placed], profile, start)
    assert reason is not None and words in reason


def test_overlapping_layouts_are_reported_by_layout_problems():
    problems = mig.layout_problems(A100_80GB, [Instance("3g.40gb", 0), Instance("2g.20gb", 2)])
    assert len(problems) == 1 and "overlaps" in problems[0]


@pytest.mark.parametrize("profile,limit", [("1g.20gb", 4), ("2g.20gb", 3), ("3g.40gb", 2), ("4g.40gb", 1),
                                           ("7g.80gb", 1), ("1g.10gb+me", 1)])
def test_count_limits_per_profile_hold(profile, limit):
    placed: list[Instance] = []
    while True:
        starts = mig.legal_starts(H100_80GB, placed, profile)
        if not starts:
            break
        placed.append(Instance(profile, starts[0]))
    assert len(placed) == limit


def test_count_limit_is_named_in_the_reason():
    placed = [Instance("1g.10gb+me", 0)]
    reason = mig.why_not(A100_80GB, placed, "1g.10gb+me", 3)
    assert reason is not None and "limited to 1" in reason


def test_compute_slices_cap_the_total_at_seven_even_with_memory_free():
    # 3 × 2g (6 compute, slices 0-5) + 1g at 6 = 7 compute; slice 7 stays free but nothing more fits
    placed = [Instance("2g.20gb", 0), Instance("2g.20gb", 2), Instance("2g.20gb", 4), Instance("1g.10gb", 6)]
    assert mig.layout_problems(A100_80GB, placed) == []
    assert mig.free_capacity(A100_80GB, placed) == (1, 0)
    for p in A100_80GB.profiles:
        assert mig.legal_starts(A100_80GB, placed, p.name) == []


def test_a_4g_and_a_3g_use_all_seven_compute_slices():
    placed = [Instance("4g.40gb", 0), Instance("3g.40gb", 4)]
    assert mig.free_capacity(A100_80GB, placed) == (0, 0)


@pytest.mark.parametrize("profile,starts,size,max_count", [
    ("1g.6gb", (0, 1, 2, 3), 1, 4),
    ("2g.12gb", (0, 2), 2, 2),
    ("4g.24gb", (0,), 4, 1),
    ("1g.6gb+me", (0, 1, 2, 3), 1, 1),
])
def test_a30_profiles_follow_the_guide(profile, starts, size, max_count):
    p = A30_24GB.profile(profile)
    assert (p.starts, p.memory_slices, p.max_count) == (starts, size, max_count)


def test_a30_has_four_memory_and_four_compute_slices():
    assert (A30_24GB.memory_slices, A30_24GB.compute_slices) == (4, 4)
    assert A30_24GB.full_profile.name == "4g.24gb"


def test_on_an_a30_two_2g_fit_and_a_1g_then_does_not():
    placed = [Instance("2g.12gb", 0), Instance("2g.12gb", 2)]
    assert mig.layout_problems(A30_24GB, placed) == []
    assert mig.legal_starts(A30_24GB, placed, "1g.6gb") == []


def test_on_an_a30_a_2g_cannot_start_at_slice_1():
    assert "cannot start" in mig.why_not(A30_24GB, [], "2g.12gb", 1)


def test_on_an_a30_four_1g_fit_and_take_all_compute():
    placed = [Instance("1g.6gb", s) for s in range(4)]
    assert mig.layout_problems(A30_24GB, placed) == []
    assert mig.free_capacity(A30_24GB, placed) == (0, 0)


@pytest.mark.parametrize("geometry,memory_gb,compute,expected", [
    (A100_80GB, 5, 1, "1g.10gb"),
    (A100_80GB, 15, 1, "1g.20gb"),
    (A100_80GB, 15, 2, "2g.20gb"),
    (A100_80GB, 30, 1, "3g.40gb"),
    (A100_80GB, 40, 4, "4g.40gb"),
    (A100_80GB, 60, 1, "7g.80gb"),
    (A100_80GB, 81, 1, None),
    (H200_141GB, 30, 1, "1g.35gb"),
    (A30_24GB, 10, 1, "2g.12gb"),
    (A30_24GB, 6, 3, "4g.24gb"),
])
def test_smallest_fitting_profile_has_enough_memory_and_compute(geometry, memory_gb, compute, expected):
    p = mig.smallest_fitting_profile(geometry, memory_gb=memory_gb, compute_slices=compute)
    assert (p.name if p else None) == expected


def test_used_mask_and_occupancy_agree():
    placed = [Instance("3g.40gb", 4), Instance("1g.10gb", 1)]
    assert mig.used_mask(A100_80GB, placed) == 0b11110010
    assert mig.occupancy(A100_80GB, placed) == [None, 1, None, None, 0, 0, 0, 0]
