"""Protocol checks found by fuzzing: version strings, a GPU's model against its name and memory, memory used
against memory total. Each refused with the reason in the message."""
from __future__ import annotations

import pytest

from nodeagent import protocol
from nodeagent.hardware import gpus as catalog
from tests.agentframes import hello_from, sim_backend


def hello_with(**changes) -> dict:
    frame = hello_from(sim_backend("h100-80gb:1,l4:1", hostname="checks"))
    gpu = changes.pop("gpu", None)
    if gpu:
        frame["gpus"][0].update(gpu)
    frame.update(changes)
    return frame


@pytest.mark.parametrize("key, value", [("driver_version", "550.54.15"), ("driver_version", "580.159.04"),
                                        ("driver_version", "551.61"), ("cuda_version", "13.0"),
                                        ("cuda_version", "12.4"), ("cuda_version", "13")])
def test_version_strings_of_digits_and_dots_are_accepted(key, value):
    protocol.validate_hello(hello_with(**{key: value}))


@pytest.mark.parametrize("key, value", [
    ("cuda_version", "twelve"), ("cuda_version", "12.4; DROP TABLE"), ("cuda_version", ""),
    ("cuda_version", "1." * 10 + "1"), ("driver_version", "550..54"), ("driver_version", "550.54.15-beta"),
    ("driver_version", "9" * 41), ("cuda_version", " 12.4"), ("cuda_version", "12.4\n"),
])
def test_a_version_that_is_not_digits_and_dots_is_refused_with_the_reason(key, value):
    with pytest.raises(protocol.ProtocolError, match=f"'{key}' must be a version of digits and dots"):
        protocol.validate_hello(hello_with(**{key: value}))


@pytest.mark.parametrize("gpu, reason", [
    ({"model": "h100-80gb", "name": "NVIDIA L4"}, "says model h100-80gb but its name 'NVIDIA L4' is L4"),
    ({"model": "h100-80gb", "name": "Totally Real GPU"}, "is not a H100-80GB"),
    ({"model": "h100-80gb", "memory_mib": 23034}, "says model h100-80gb (80 GB) but reports 23034 MiB"),
    ({"model": "h100-80gb", "memory_mib": 95830}, "reports 95830 MiB"),  # an H100 NVL's memory
    ({"model": "a100-40gb", "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}, "is A100-80GB"),
])
def test_a_gpu_whose_model_disagrees_with_its_name_or_memory_is_refused_with_the_reason(gpu, reason):
    with pytest.raises(protocol.ProtocolError, match="hello.gpus\\[0\\]") as caught:
        protocol.validate_hello(hello_with(gpu=gpu))
    assert reason in caught.value.message


@pytest.mark.parametrize("spec", list(catalog.GPU_MODELS))
def test_every_simulated_model_agrees_with_its_own_name_and_memory(spec):
    protocol.validate_hello(hello_from(sim_backend(f"{spec}:1", hostname="sim")))


# Names and total memory as NVML reports them on real boards (nvidia-smi --query-gpu=name,memory.total).
@pytest.mark.parametrize("name, memory_mib, key", [
    ("NVIDIA H100 80GB HBM3", 81559, "h100-80gb"), ("NVIDIA H100 NVL", 95830, "h100-nvl-94gb"),
    ("NVIDIA H200", 143771, "h200-141gb"),  # read through NVML on an H200, driver 580.159.04
    ("NVIDIA A100-SXM4-40GB", 40960, "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB", 81920, "a100-80gb"), ("NVIDIA A100 80GB PCIe", 81920, "a100-80gb"),
    ("NVIDIA A30", 24576, "a30-24gb"), ("NVIDIA L40S", 46068, "l40s"), ("NVIDIA L4", 23034, "l4"),
    ("NVIDIA A10", 23028, "a10"), ("NVIDIA GeForce RTX 4090", 24564, "rtx-4090"),
    ("Tesla V100-SXM2-32GB", 32768, "v100"), ("Tesla T4", 15360, "t4"),
    # Boards the catalog does not hold: unknown (sold as no model) rather than taken for a neighbour.
    ("NVIDIA L40", 46068, None), ("Tesla V100-SXM2-16GB", 16160, None),
])
def test_a_real_boards_name_and_memory_give_its_catalog_key_or_none(name, memory_mib, key):
    assert catalog.key_for_gpu(name, memory_mib) == key
    if key:  # what the NVML agent reports passes the server's check
        assert catalog.model_disagreement(key, name=name, memory_mib=memory_mib) is None


def test_an_unknown_model_key_is_not_judged_and_a_null_model_is_accepted():
    protocol.validate_hello(hello_with(gpu={"model": "b200-192gb", "name": "NVIDIA B200", "memory_mib": 183359}))
    protocol.validate_hello(hello_with(gpu={"model": None, "name": "NVIDIA L40", "memory_mib": 46068}))


def test_memory_used_above_memory_total_is_refused_with_both_numbers():
    sample = {"uuid": "GPU-1", "util": 5.0, "mem_used_mib": 90000, "mem_total_mib": 81559}
    assert not protocol._sample_ok(sample)
    with pytest.raises(protocol.ProtocolError, match="mem_used_mib=90000 is more than mem_total_mib=81559"):
        protocol.validate_metrics({"v": 1, "type": "metrics", "ts": 1.0, "gpus": [sample]})
    for ok in ({"mem_used_mib": 81559, "mem_total_mib": 81559}, {"mem_used_mib": 10, "mem_total_mib": None}):
        protocol.validate_metrics({"v": 1, "type": "metrics", "ts": 1.0, "gpus": [{"uuid": "GPU-1", **ok}]})
