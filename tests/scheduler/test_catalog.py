"""The seeded GPU catalog: every model of DESIGN.md §4 with figures, MIG geometry and performance units."""
from __future__ import annotations

import pytest

from nodeagent.hardware import gpus
from scheduler.core import perf
from scheduler.models import GpuModel

pytestmark = pytest.mark.django_db

DESIGN_MODELS = {"A100-40GB": True, "A100-80GB": True, "H100-80GB": True, "H100-NVL-94GB": True, "H200-141GB": True,
                 "A30-24GB": True, "L40S": False, "L4": False, "A10": False, "RTX-4090": False, "V100": False,
                 "T4": False}


def test_every_model_of_the_brief_is_seeded_with_its_figures():
    seeded = {m.name: m for m in GpuModel.objects.prefetch_related("profiles")}
    assert set(DESIGN_MODELS) <= set(seeded)
    for name, mig_capable in DESIGN_MODELS.items():
        m = seeded[name]
        assert m.memory_gb > 0 and m.fp32_tflops > 0 and m.memory_bandwidth_gbs > 0 and m.pu > 0
        assert m.compute_capability.count(".") == 1
        assert m.mig_capable == mig_capable
        assert (m.profiles.count() > 0) == mig_capable


@pytest.mark.parametrize("key, profiles", [
    ("a100-40gb", ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    ("h100-80gb", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("h100-nvl-94gb", ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"]),
    ("h200-141gb", ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
    ("a30-24gb", ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]),
    ("h800-80gb", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("h20-96gb", ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"]),
    ("b200-180gb", ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"]),
])
def test_mig_models_carry_the_full_geometry_with_performance_units(key, profiles):
    model = GpuModel.objects.get(key=key)
    assert sorted(p.name for p in model.profiles.all()) == sorted(profiles)
    geometry = model.geometry()
    assert geometry == gpus.model_for(key).mig
    for p in model.profiles.all():
        assert p.pu == pytest.approx(perf.profile_pu(gpus.model_for(key), p.as_core()))
    full = max(model.profiles.all(), key=lambda p: p.memory_slices)
    assert full.pu == pytest.approx(model.pu)


@pytest.mark.parametrize("name, mig_capable", [("H800-80GB", True), ("H20-96GB", True), ("B200-180GB", True),
                                               ("L20", False), ("P100", False)])
def test_the_models_of_issue_12_are_seeded_by_the_migrations(name, mig_capable):
    m = GpuModel.objects.get(name=name)
    assert m.mig_capable is mig_capable and m.pu > 0 and (m.profiles.count() > 0) is mig_capable


def test_performance_units_order_models_the_way_their_figures_do():
    pu = {k: perf.gpu_pu(s) for k, s in gpus.GPU_MODELS.items()}
    assert pu["a100-80gb"] == 10.0  # the reference
    assert pu["h200-141gb"] > pu["h100-80gb"] > pu["a100-80gb"] > pu["a100-40gb"] > pu["a30-24gb"] > pu["t4"]
    h100 = gpus.model_for("h100-80gb")
    one_g = perf.profile_pu(h100, h100.mig.profile("1g.10gb"))
    assert 7 * one_g < pu["h100-80gb"] * 1.01  # seven 1g never add up to more than the whole GPU


NEW_KEYS = ["h800-80gb", "h20-96gb", "l20", "b200-180gb", "p100"]


@pytest.mark.django_db(transaction=True)
def test_migration_0012_adds_the_new_models_to_a_catalog_seeded_before_them():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = ("scheduler", "0011_node_drained_by"), ("scheduler", "0012_catalog_h800_h20_l20_b200_p100")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    try:
        # A database seeded before these models existed: the catalog without them.
        GpuModel.objects.filter(key__in=NEW_KEYS).delete()
        assert not GpuModel.objects.filter(key__in=NEW_KEYS).exists()
        executor = MigrationExecutor(connection)
        executor.migrate([after])
        seeded = {m.key: m for m in GpuModel.objects.filter(key__in=NEW_KEYS).prefetch_related("profiles")}
        assert sorted(seeded) == sorted(NEW_KEYS)
        assert seeded["b200-180gb"].geometry() == gpus.model_for("b200-180gb").mig
        assert seeded["l20"].profiles.count() == 0
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
