"""The NVML backend against a fake pynvml that enforces MIG placement like a driver."""
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent import protocol
from nodeagent.backends.nvml import NvmlBackend, NvmlUnavailable
from nodeagent.errors import BackendError
from tests.nodeagent import fake_pynvml as F

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake():
    return F.FakePynvml([F.FakeGpu.h100(), F.FakeGpu.l4()])


@pytest.fixture
def backend(fake):
    return NvmlBackend(nvml=fake, hostname="gpu-1")


def h100_uuid(fake):
    return fake.gpus[0].uuid


def test_fake_errors_have_pynvml_shape():
    import pynvml
    for name in ("NVMLError_InsufficientResources", "NVMLError_NotSupported", "NVMLError_LibraryNotFound",
                 "NVMLError_InvalidArgument", "NVMLError_NotFound", "NVMLError_Timeout"):
        assert hasattr(pynvml, name) and hasattr(F, name)
        assert issubclass(getattr(F, name), F.NVMLError)
    assert type(F.NVMLError(F.NVML_ERROR_NOT_FOUND)) is F.NVMLError_NotFound
    assert F.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    assert [f[0] for f in F.c_nvmlGpuInstancePlacement_t._fields_] == ["start", "size"]


def test_inventory_reports_node_facts_and_geometry_built_from_nvml(backend, fake):
    facts = backend.inventory()
    protocol.validate_hello(protocol.hello(agent_version="t", **facts))
    assert (facts["backend"], facts["driver_version"], facts["cuda_version"]) == ("nvml", "550.54.15", "12.4")
    h100, l4 = facts["gpus"]
    assert h100["model"] == "h100-80gb" and h100["mig_enabled"] and h100["memory_mib"] == 81559
    geo = h100["mig"]
    assert (geo["memory_slices"], geo["compute_slices"]) == (8, 7)
    by_name = {p["name"]: p for p in geo["profiles"]}
    assert set(by_name) == {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
    assert by_name["3g.40gb"] == {"name": "3g.40gb", "compute_slices": 3, "memory_slices": 4, "memory_gb": 40.0,
                                  "starts": [0, 4], "max_count": 2, "media_extensions": False,
                                  "nvml_profile": F.NVML_GPU_INSTANCE_PROFILE_3_SLICE}
    assert by_name["1g.20gb"]["memory_slices"] == 2 and by_name["1g.20gb"]["starts"] == [0, 2, 4, 6]
    assert by_name["1g.10gb+me"]["media_extensions"] and by_name["1g.10gb+me"]["max_count"] == 1
    assert l4["model"] == "l4" and not l4["mig_enabled"] and l4["mig"] is None


def test_geometry_names_fall_back_to_nvidia_smi_convention_on_old_drivers():
    fake = F.FakePynvml([F.FakeGpu.h100()], v2_profile_info=False)
    names = {p["name"] for p in NvmlBackend(nvml=fake).inventory()["gpus"][0]["mig"]["profiles"]}
    assert names == {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}


def test_geometry_matches_the_catalog_for_an_h100():
    from nodeagent.hardware import mig
    reported = NvmlBackend(nvml=F.FakePynvml([F.FakeGpu.h100()])).inventory()["gpus"][0]["mig"]
    geometry = mig.MigGeometry.from_dict(reported)
    assert (geometry.memory_slices, geometry.compute_slices) == (8, 7)
    assert sorted(geometry.profiles, key=lambda p: p.name) == sorted(mig.H100_80GB.profiles, key=lambda p: p.name)


def test_create_uses_the_placement_and_returns_the_mig_device_uuid(backend, fake):
    made = backend.create_instance(h100_uuid(fake), "3g.40gb", 4)
    [gi] = fake.all_gpu_instances()
    assert (gi.rule.name, gi.start, len(gi.cis)) == ("3g.40gb", 4, 1)
    assert made["instance_uuid"] == gi.mig_uuid and made["instance_uuid"].startswith("MIG-")
    assert made["cuda_visible_devices"] == made["instance_uuid"]
    [listed] = backend.inventory()["gpus"][0]["instances"]
    assert listed == {"uuid": gi.mig_uuid, "profile": "3g.40gb", "start": 4, "size": 4}


def test_overlapping_placement_maps_to_insufficient_and_leaves_nothing_behind(backend, fake):
    backend.create_instance(h100_uuid(fake), "3g.40gb", 4)
    with pytest.raises(BackendError) as err:
        backend.create_instance(h100_uuid(fake), "2g.20gb", 4)
    assert err.value.code == protocol.E_INSUFFICIENT
    assert len(fake.all_gpu_instances()) == 1


def test_illegal_start_maps_to_illegal_placement_with_the_legal_starts(backend, fake):
    with pytest.raises(BackendError) as err:
        backend.create_instance(h100_uuid(fake), "3g.40gb", 2)
    assert err.value.code == protocol.E_PLACEMENT and "0, 4" in err.value.message
    assert fake.all_gpu_instances() == []


def test_unknown_profile_gpu_and_non_mig_gpu_are_refused(backend, fake):
    for gpu, profile, code in ((h100_uuid(fake), "5g.50gb", protocol.E_PLACEMENT),
                               ("GPU-missing", "1g.10gb", protocol.E_NOT_FOUND),
                               (fake.gpus[1].uuid, "1g.10gb", protocol.E_NOT_SUPPORTED)):
        with pytest.raises(BackendError) as err:
            backend.create_instance(gpu, profile, 0)
        assert err.value.code == code


def test_failure_after_the_gpu_instance_exists_destroys_it(backend, fake):
    fake.fail_next("nvmlGpuInstanceCreateComputeInstance", F.NVML_ERROR_INSUFFICIENT_RESOURCES)
    with pytest.raises(BackendError) as err:
        backend.create_instance(h100_uuid(fake), "2g.20gb", 2)
    assert err.value.code == protocol.E_INSUFFICIENT
    assert fake.all_gpu_instances() == []  # no half-made instance
    backend.create_instance(h100_uuid(fake), "2g.20gb", 2)  # and the slot is usable


def test_destroy_removes_compute_then_gpu_instance(backend, fake):
    made = backend.create_instance(h100_uuid(fake), "7g.80gb", 0)
    result = backend.destroy_instance(h100_uuid(fake), made["instance_uuid"])
    assert result["destroyed"] and fake.all_gpu_instances() == []
    calls = [c for c in fake.calls if c in ("nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy")]
    assert calls == ["nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy"]
    with pytest.raises(BackendError) as err:
        backend.destroy_instance(h100_uuid(fake), made["instance_uuid"])
    assert err.value.code == protocol.E_NOT_FOUND


def test_gpu_instance_without_compute_instance_is_reported_and_destroyable(backend, fake):
    placement = F.c_nvmlGpuInstancePlacement_t(0, 2)
    fake.nvmlDeviceCreateGpuInstanceWithPlacement(fake.gpus[0], 14, placement)  # e.g. left by a crash
    [listed] = backend.inventory()["gpus"][0]["instances"]
    assert listed["profile"] == "2g.20gb" and listed["start"] == 0
    backend.destroy_instance(h100_uuid(fake), listed["uuid"])
    assert fake.all_gpu_instances() == []


def test_metrics_convert_units_and_report_unsupported_readings_as_none(backend, fake):
    fake.gpus[1].unsupported |= {"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPowerUsage"}
    fake.gpus[0].ecc_dbe = 2
    h100, l4 = backend.sample()
    protocol.validate_metrics(protocol.metrics(ts=1.0, gpus=[h100, l4]))
    assert h100["util"] is None  # no whole-GPU utilisation in MIG mode
    assert (h100["power_w"], h100["temp_c"], h100["sm_clock_mhz"]) == (71.2, 36, 1755)
    assert (h100["mem_used_mib"], h100["mem_total_mib"], h100["ecc_dbe"]) == (600, 81559, 2)
    assert l4["util"] == 4 and l4["power_w"] is None and l4["ecc_sbe"] is None and l4["ecc_dbe"] is None


def test_xid_events_are_drained_each_sample_and_charged_to_their_gpu(backend, fake):
    fake.emit_xid(fake.gpus[1], 79)
    fake.emit_xid(fake.gpus[1], 48)
    h100, l4 = backend.sample()
    assert h100["xid"] == [] and l4["xid"] == [79, 48]
    assert [s["xid"] for s in backend.sample()] == [[], []]


def test_nvml_calls_not_supported_for_simulation_only_commands(backend, fake):
    with pytest.raises(BackendError) as err:
        backend.inject_fault(h100_uuid(fake), "overheat")
    assert err.value.code == protocol.E_NOT_SUPPORTED


@pytest.mark.parametrize("code, words", [
    (F.NVML_ERROR_LIBRARY_NOT_FOUND, "library not found"),
    (F.NVML_ERROR_DRIVER_NOT_LOADED, "not loaded"),
])
def test_missing_driver_at_init_is_nvml_unavailable(code, words):
    with pytest.raises(NvmlUnavailable, match=words):
        NvmlBackend(nvml=F.FakePynvml([], init_error=code))


def test_agent_without_a_driver_says_so_and_exits_2():
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:
        pass
    else:
        pytest.skip("this machine has a working NVIDIA driver")
    proc = subprocess.run([sys.executable, "-m", "nodeagent", "--server", "ws://127.0.0.1:9/ws/agent/",
                           "--token", "t"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "NVML is not available on this machine" in proc.stderr and "--simulate" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
