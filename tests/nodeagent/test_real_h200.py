"""What a real H200 reported through our NVML backend (tests/nodeagent/data/h200_nvml.json, read on a lent H200
with nothing changed on it) against the catalog's geometry and our protocol: the one source of truth for MIG
(nodeagent/hardware/mig.py) must be what the hardware says."""
import json
import time
from pathlib import Path

from nodeagent import protocol
from nodeagent.hardware import gpus as catalog, mig

READING = json.loads((Path(__file__).parent / "data" / "h200_nvml.json").read_text())


def test_the_catalog_h200_geometry_is_the_one_nvml_reported():
    ours = {p.name: p for p in mig.H200_141GB.profiles}
    assert set(ours) == set(READING["profiles"])
    for name, seen in READING["profiles"].items():
        p = ours[name]
        assert (p.compute_slices, p.memory_slices, list(p.starts), p.max_count, p.media_extensions, p.nvml_profile) \
            == (seen["compute_slices"], seen["memory_slices"], seen["starts"], seen["max_count"],
                seen["media_extensions"], seen["nvml_profile"]), name
        assert p.memory_gb == seen["memory_gb"], name


def test_the_real_h200_is_named_by_the_catalog_and_its_frames_pass_our_protocol():
    gpu = READING["gpu"]
    assert catalog.key_for_gpu(gpu["name"], gpu["memory_mib"]) == gpu["model"] == "h200-141gb"
    uuid = "GPU-52893c85-470d-4417-4d03-2c7916acee71"
    hello = protocol.hello(hostname="h200", agent_version="test", backend="nvml", driver_version=READING["driver_version"],
                           cuda_version=READING["cuda_version"], gpus=[{
                               "uuid": uuid, "index": 0, "name": gpu["name"], "model": gpu["model"],
                               "memory_mib": gpu["memory_mib"], "mig_enabled": False, "mig": None, "instances": []}])
    protocol.validate(json.loads(protocol.encode(hello)))
    protocol.validate(json.loads(protocol.encode(protocol.metrics(ts=time.time(), gpus=[{"uuid": uuid,
                                                                                        **READING["sample"]}]))))
