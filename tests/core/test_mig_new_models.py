"""The catalog's H800, H20, B200 (MIG) and L20, P100 (no MIG): NVIDIA's published profiles, and the geometry
rules (legal starts, sizes, per-GPU counts, the compute-slice cap) hold for them as for the A100/H100."""
from __future__ import annotations

import pytest

from nodeagent.hardware import gpus, mig
from nodeagent.hardware.mig import Instance
from scheduler.core import perf

# (catalog key, memory GB, {profile: (compute slices, memory slices, memory GB, legal starts, max count)})
EIGHT = {1: (0, 1, 2, 3, 4, 5, 6), 2: (0, 2, 4, 6)}
NEW_MIG_MODELS = [
    ("h800-80gb", 80, {
        "1g.10gb": (1, 1, 10, EIGHT[1], 7), "1g.10gb+me": (1, 1, 10, EIGHT[1], 1), "1g.20gb": (1, 2, 20, EIGHT[2], 4),
        "2g.20gb": (2, 2, 20, (0, 2, 4), 3), "3g.40gb": (3, 4, 40, (0, 4), 2), "4g.40gb": (4, 4, 40, (0,), 1),
        "7g.80gb": (7, 8, 80, (0,), 1)}),
    ("h20-96gb", 96, {
        "1g.12gb": (1, 1, 12, EIGHT[1], 7), "1g.12gb+me": (1, 1, 12, EIGHT[1], 1), "1g.24gb": (1, 2, 24, EIGHT[2], 4),
        "2g.24gb": (2, 2, 24, (0, 2, 4), 3), "3g.48gb": (3, 4, 48, (0, 4), 2), "4g.48gb": (4, 4, 48, (0,), 1),
        "7g.96gb": (7, 8, 96, (0,), 1)}),
    ("b200-180gb", 180, {
        "1g.23gb": (1, 1, 23, EIGHT[1], 7), "1g.23gb+me": (1, 1, 23, EIGHT[1], 1), "1g.45gb": (1, 2, 45, EIGHT[2], 4),
        "2g.45gb": (2, 2, 45, (0, 2, 4), 3), "3g.90gb": (3, 4, 90, (0, 4), 2), "4g.90gb": (4, 4, 90, (0,), 1),
        "7g.180gb": (7, 8, 180, (0,), 1)}),
]
IDS = [key for key, _, _ in NEW_MIG_MODELS]


@pytest.mark.parametrize("key, memory_gb, profiles", NEW_MIG_MODELS, ids=IDS)
def test_new_mig_models_carry_nvidias_profiles(key, memory_gb, profiles):
    spec = gpus.model_for(key)
    g = spec.mig
    assert spec.memory_gb == memory_gb and g.memory_slices == 8 and g.compute_slices == 7
    got = {p.name: (p.compute_slices, p.memory_slices, p.memory_gb, p.starts, p.max_count) for p in g.profiles}
    assert got == profiles
    assert g.full_profile.name == f"7g.{memory_gb}gb"
    small_1g = next(n for n, (c, size, *_rest) in profiles.items() if c == 1 and size == 1 and "+" not in n)
    assert [p.name for p in g.profiles if p.media_extensions] == [f"{small_1g}+me"]  # one +me: the media engines


@pytest.mark.parametrize("key", IDS)
def test_every_profile_fits_an_empty_gpu_at_each_of_its_starts_and_nowhere_else(key):
    g = gpus.model_for(key).mig
    for p in g.profiles:
        for start in range(g.memory_slices):
            assert (mig.why_not(g, [], p.name, start) is None) is (start in p.starts), (p.name, start)


@pytest.mark.parametrize("key", IDS)
def test_seven_small_1g_fill_the_compute_and_an_eighth_is_refused(key):
    g = gpus.model_for(key).mig
    one = min((p for p in g.profiles if p.compute_slices == 1 and not p.media_extensions),
              key=lambda p: p.memory_slices)
    placed: list[Instance] = []
    for s in range(7):
        assert mig.why_not(g, placed, one.name, s) is None
        placed.append(Instance(one.name, s))
    assert mig.legal_starts(g, placed, one.name) == []
    assert mig.free_capacity(g, placed) == (1, 0)


@pytest.mark.parametrize("key", IDS)
def test_max_counts_hold_per_gpu(key):
    g = gpus.model_for(key).mig
    for p in g.profiles:
        placed: list[Instance] = []
        for start in p.starts:
            if mig.why_not(g, placed, p.name, start) is None:
                placed.append(Instance(p.name, start))
        assert len(placed) == p.max_count, p.name
        assert mig.layout_problems(g, placed) == []


@pytest.mark.parametrize("key", IDS)
def test_a_4g_and_a_3g_share_a_gpu_and_leave_nothing_for_a_third_instance(key):
    g = gpus.model_for(key).mig
    four = next(p.name for p in g.profiles if p.name.startswith("4g."))
    three = next(p.name for p in g.profiles if p.name.startswith("3g."))
    placed = [Instance(four, 0), Instance(three, 4)]
    assert mig.layout_problems(g, placed) == []
    assert mig.free_capacity(g, placed) == (0, 0)
    assert mig.legal_starts(g, placed, g.profiles[0].name) == []
    # Two 3g take every memory slice and 6 of the 7 compute slices: the seventh is stranded.
    assert mig.layout_problems(g, [Instance(three, 0), Instance(three, 4)]) == []
    assert mig.free_capacity(g, [Instance(three, 0), Instance(three, 4)]) == (0, 1)


@pytest.mark.parametrize("key", ["l20", "p100"])
def test_l20_and_p100_are_rented_whole(key):
    spec = gpus.model_for(key)
    assert spec.mig is None and not spec.mig_capable


@pytest.mark.parametrize("name, memory_mib, key", [
    ("NVIDIA H800", 81559, "h800-80gb"), ("NVIDIA H20", 97871, "h20-96gb"), ("NVIDIA B200", 183359, "b200-180gb"),
    ("NVIDIA L20", 46068, "l20"), ("Tesla P100-PCIE-16GB", 16280, "p100"),
    ("NVIDIA H200", 143771, "h200-141gb"),  # "H200" contains "H20": still the H200
])
def test_nvml_names_of_the_new_boards_give_their_catalog_keys(name, memory_mib, key):
    assert gpus.key_for_gpu(name, memory_mib) == key


def test_performance_units_order_the_new_models_by_their_figures():
    pu = {k: perf.gpu_pu(s) for k, s in gpus.GPU_MODELS.items()}
    assert pu["b200-180gb"] > pu["h200-141gb"] > pu["h800-80gb"] == pu["h100-80gb"] > pu["a100-80gb"]
    assert pu["a100-80gb"] > pu["h20-96gb"]  # 148 dense TFLOPS: bandwidth and memory do not make up for it
    assert pu["l20"] > pu["a10"] > pu["t4"] > pu["p100"]
