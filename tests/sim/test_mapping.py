"""Model mapping, milli -> MIG profile tables and qos classes (docs/simulator.md shows the same tables)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.sim import mapping as m


@pytest.mark.parametrize("old, new", [
    ("P100", "a30-24gb"), ("T4", "a30-24gb"), ("V100M16", "a30-24gb"),
    ("V100M32", "a100-40gb"), ("G1", "h100-80gb"), ("G2", "a100-80gb"), ("G3", "h100-80gb"),
])
def test_default_mapping_puts_each_old_model_on_a_mig_model_with_at_least_its_memory(old: str, new: str) -> None:
    assert m.map_model(old, m.DEFAULT_MODEL_MAP) == new
    from nodeagent.hardware.gpus import model_for
    assert model_for(new).mig is not None
    card = m.TRACE_CARDS[old]
    assert card.memory_gb is None or model_for(new).memory_gb >= card.memory_gb


def test_a10_maps_to_the_catalogs_a10_rented_whole_not_to_a_splittable_a30() -> None:
    from nodeagent.hardware.gpus import model_for
    assert m.map_model("A10", m.DEFAULT_MODEL_MAP) == "a10" and model_for("a10").mig is None


@pytest.mark.parametrize("spec", [
    "T4=a100-40gb,G2=h100-80gb",
    '{"T4": "a100-40gb", "G2": "h100-80gb"}',
])
def test_mapping_overrides_from_the_command_line(spec: str) -> None:
    mapping = m.parse_model_map(spec)
    assert mapping["T4"] == "a100-40gb" and mapping["G2"] == "h100-80gb" and mapping["P100"] == "a30-24gb"


def test_mapping_override_from_a_json_file(tmp_path: Path) -> None:
    f = tmp_path / "map.json"
    f.write_text(json.dumps({"V100M32": "A100-80GB", "X9": "l4"}))
    mapping = m.parse_model_map(str(f))
    assert mapping["V100M32"] == "a100-80gb" and mapping["X9"] == "l4"


@pytest.mark.parametrize("spec, message", [
    ("T4=b300", "'b300', which is not a catalog model"), ("T4", "not TRACE-NAME=catalog-key"),
    ("[1]", "must be a JSON object"), ("{bad", "not valid JSON"),
])
def test_bad_mapping_overrides_are_refused(spec: str, message: str) -> None:
    from scheduler.sim.errors import SimInputError
    with pytest.raises(SimInputError, match=message):
        m.parse_model_map(spec)


def test_an_unmapped_trace_model_says_how_to_map_it() -> None:
    from scheduler.sim.errors import SimInputError
    with pytest.raises(SimInputError, match="--model-map 'K80=<catalog key>'"):
        m.map_model("K80", m.DEFAULT_MODEL_MAP)


@pytest.mark.parametrize("milli, profile", [
    (50, "1g.10gb"), (110, "1g.10gb"), (160, "1g.20gb"), (230, "1g.20gb"), (320, "3g.40gb"),
    (470, "3g.40gb"), (500, "3g.40gb"), (650, "7g.80gb"), (810, "7g.80gb"), (1000, "7g.80gb"),
])
def test_milli_to_profile_by_memory_on_a100_80gb(milli: int, profile: str) -> None:
    assert m.profile_for_share(milli, "a100-80gb") == profile


@pytest.mark.parametrize("milli, profile", [
    (110, "1g.6gb"), (230, "1g.6gb"), (320, "2g.12gb"), (470, "2g.12gb"), (650, "4g.24gb"), (1000, "4g.24gb"),
])
def test_milli_to_profile_by_memory_on_a30_is_a_share_of_its_own_24gb(milli: int, profile: str) -> None:
    assert m.profile_for_share(milli, "a30-24gb") == profile


@pytest.mark.parametrize("milli, profile", [
    (50, "1g.6gb"), (110, "2g.12gb"), (230, "4g.24gb"), (300, "4g.24gb"), (320, None), (470, None),
])
def test_milli_to_profile_against_the_80gb_reference_on_a30(milli: int, profile: str | None) -> None:
    # What the replay asks for by default: 47% of an 80 GB GPU (37.6 GB) has no slice on a 24 GB A30.
    assert m.profile_for_share(milli, "a30-24gb", reference_gb=80) == profile


@pytest.mark.parametrize("milli, profile", [
    (100, "1g.10gb"), (230, "2g.20gb"), (320, "3g.40gb"), (470, "4g.40gb"), (810, "7g.80gb"),
])
def test_milli_to_profile_by_compute_on_a100_80gb(milli: int, profile: str) -> None:
    assert m.profile_for_share(milli, "a100-80gb", basis="compute") == profile


def test_a_gpu_without_mig_has_no_profile() -> None:
    assert m.profile_for_share(470, "a10") is None


@pytest.mark.parametrize("qos, priority", [("Guaranteed", 3), ("LS", 2), ("Burstable", 1), ("BE", 0), ("?", 2)])
def test_qos_classes_order_guaranteed_ls_burstable_be(qos: str, priority: int) -> None:
    assert m.priority_for(qos) == priority


def test_a_fractional_pod_asks_for_memory_against_the_reference() -> None:
    d = m.demand_for(1, 470, ("G2",), "BE", mapping=m.DEFAULT_MODEL_MAP)  # G2's memory is undisclosed
    assert (d.whole_gpu, d.gpu_count, d.memory_gb, d.compute_slices) == (False, 1, 37.6, 1)
    assert d.models == frozenset({"a100-80gb"}) and d.priority == 0 and d.share == 0.47


def test_a_pod_pinned_to_old_cards_asks_for_its_share_of_the_smallest_of_them() -> None:
    d = m.demand_for(1, 470, ("T4", "G2"), "BE", mapping=m.DEFAULT_MODEL_MAP)
    assert d.memory_gb == 7.52  # 47% of a 16 GB T4, which fits every card it may run on
    assert d.models == frozenset({"a30-24gb", "a100-80gb"})


def test_a_multi_gpu_pod_asks_for_whole_gpus_on_one_node() -> None:
    d = m.demand_for(8, 1000, (), "LS", mapping=m.DEFAULT_MODEL_MAP)
    assert (d.whole_gpu, d.gpu_count, d.memory_gb, d.models, d.share) == (True, 8, 0.0, None, 8.0)


def test_compute_basis_asks_for_compute_slices() -> None:
    d = m.demand_for(1, 470, (), "LS", mapping=m.DEFAULT_MODEL_MAP, basis="compute")
    assert (d.memory_gb, d.compute_slices) == (0.0, 4)
