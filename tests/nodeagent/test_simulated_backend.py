"""The simulated backend: catalog models, NVIDIA's MIG rules through the backend, metrics, faults."""
import json

import pytest

from nodeagent import protocol
from nodeagent.backends.simulated import SimulatedBackend, SimulateSpecError, parse_simulate_spec
from nodeagent.errors import BackendError


def make(spec="h100-80gb:2,l4:1", seed=7):
    backend = SimulatedBackend(spec, hostname="node-a", seed=seed)
    gpus = backend.inventory()["gpus"]
    return backend, gpus


@pytest.mark.parametrize("text, expected", [
    ("h100-80gb:8", [("h100-80gb", 8)]),
    ("h100-80gb:8,l4:2", [("h100-80gb", 8), ("l4", 2)]),
    (" A100-80GB : 1 , t4:3 ", [("a100-80gb", 1), ("t4", 3)]),
])
def test_simulate_spec_parses_models_and_counts(text, expected):
    assert parse_simulate_spec(text) == expected


@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    ("h100-80gb", "bad count"),
    ("h100-80gb:0", "bad count"),
    ("h100-80gb:-1", "bad count"),
    ("h100-80gb:two", "bad count"),
    ("h100-80gb:65", "bad count"),
    ("b200:1", "unknown GPU model"),
    ("l4:1,l4:2", "given twice"),
    (":3", "missing model"),
    ("h100-80gb:40,l4:40", "more than a node"),
])
def test_simulate_spec_refuses_malformed_values_with_the_reason(text, words):
    with pytest.raises(SimulateSpecError, match=words):
        parse_simulate_spec(text)


def test_inventory_is_a_valid_hello_with_mig_models_enabled_and_empty():
    backend, gpus = make()
    facts = backend.inventory()
    protocol.validate_hello(protocol.hello(agent_version="t", **facts))
    h100, _, l4 = gpus
    assert h100["model"] == "h100-80gb" and h100["mig_enabled"] and h100["instances"] == []
    assert h100["mig"]["memory_slices"] == 8 and h100["mig"]["compute_slices"] == 7
    assert {p["name"] for p in h100["mig"]["profiles"]} >= {"1g.10gb", "3g.40gb", "7g.80gb"}
    assert l4["model"] == "l4" and not l4["mig_enabled"] and l4["mig"] is None
    assert all(g["uuid"].startswith("GPU-") for g in gpus)
    assert [g["index"] for g in gpus] == [0, 1, 2]


def test_gpu_uuids_are_stable_for_a_host_and_differ_between_hosts():
    _, first = make()
    _, again = make()
    other = SimulatedBackend("h100-80gb:2,l4:1", hostname="node-b", seed=7).inventory()["gpus"]
    assert [g["uuid"] for g in first] == [g["uuid"] for g in again]
    assert not {g["uuid"] for g in first} & {g["uuid"] for g in other}


def test_create_instance_returns_a_mig_uuid_and_shows_in_inventory():
    backend, gpus = make()
    gpu = gpus[0]["uuid"]
    made = backend.create_instance(gpu, "3g.40gb", 4)
    assert made["instance_uuid"].startswith("MIG-") and made["cuda_visible_devices"] == made["instance_uuid"]
    assert (made["gpu_uuid"], made["profile"], made["start"], made["size"]) == (gpu, "3g.40gb", 4, 4)
    [listed] = backend.inventory()["gpus"][0]["instances"]
    assert listed == {"uuid": made["instance_uuid"], "profile": "3g.40gb", "start": 4, "size": 4}


@pytest.mark.parametrize("existing, profile, start, code", [
    ([], "3g.40gb", 2, protocol.E_PLACEMENT),  # 3g starts at 0 or 4 only
    ([], "9g.90gb", 0, protocol.E_PLACEMENT),
    ([("3g.40gb", 4)], "2g.20gb", 4, protocol.E_INSUFFICIENT),  # overlaps slices 4-7
    ([("4g.40gb", 0), ("3g.40gb", 4)], "1g.10gb", 6, protocol.E_INSUFFICIENT),
    ([("1g.10gb+me", 0)], "1g.10gb+me", 1, protocol.E_INSUFFICIENT),  # one media-engine instance per GPU
    ([("7g.80gb", 0)], "1g.10gb", 0, protocol.E_INSUFFICIENT),
])
def test_create_instance_refuses_what_nvidia_forbids(existing, profile, start, code):
    backend, gpus = make()
    gpu = gpus[0]["uuid"]
    for name, at in existing:
        backend.create_instance(gpu, name, at)
    with pytest.raises(BackendError) as err:
        backend.create_instance(gpu, profile, start)
    assert err.value.code == code
    assert len(backend.inventory()["gpus"][0]["instances"]) == len(existing)


def test_compute_slices_cap_the_gpu_even_when_memory_is_free():
    backend, gpus = make()
    gpu = gpus[0]["uuid"]
    for start in range(7):
        backend.create_instance(gpu, "1g.10gb", start)
    with pytest.raises(BackendError) as err:  # slice 7 is free memory, but all 7 compute slices are used
        backend.create_instance(gpu, "1g.10gb", 6)
    assert err.value.code == protocol.E_INSUFFICIENT


def test_create_on_whole_gpu_model_or_unknown_gpu_is_refused():
    backend, gpus = make()
    with pytest.raises(BackendError) as err:
        backend.create_instance(gpus[2]["uuid"], "1g.10gb", 0)
    assert err.value.code == protocol.E_NOT_SUPPORTED
    with pytest.raises(BackendError) as err:
        backend.create_instance("GPU-nope", "1g.10gb", 0)
    assert err.value.code == protocol.E_NOT_FOUND


def test_destroy_frees_the_slices_and_unknown_instances_are_not_found():
    backend, gpus = make()
    gpu = gpus[0]["uuid"]
    made = backend.create_instance(gpu, "7g.80gb", 0)
    backend.destroy_instance(gpu, made["instance_uuid"])
    assert backend.inventory()["gpus"][0]["instances"] == []
    backend.create_instance(gpu, "3g.40gb", 0)  # the space is usable again
    with pytest.raises(BackendError) as err:
        backend.destroy_instance(gpu, made["instance_uuid"])
    assert err.value.code == protocol.E_NOT_FOUND


def _settle(backend, n=40):
    for _ in range(n):
        samples = backend.sample()
    return samples


def test_metrics_are_valid_and_idle_gpus_look_idle():
    backend, gpus = make()
    samples = _settle(backend)
    protocol.validate_metrics(protocol.metrics(ts=1.0, gpus=samples))
    assert [s["uuid"] for s in samples] == [g["uuid"] for g in gpus]
    for s in samples:
        assert s["util"] <= 8 and 28 <= s["temp_c"] <= 45 and s["xid"] == []


def test_busy_instances_raise_util_power_and_temperature_in_proportion_to_their_share():
    backend, gpus = make("h100-80gb:3")
    small, big = gpus[1]["uuid"], gpus[2]["uuid"]
    one = backend.create_instance(small, "1g.10gb", 0)
    full = backend.create_instance(big, "7g.80gb", 0)
    backend.set_busy(small, one["instance_uuid"], True)
    backend.set_busy(big, full["instance_uuid"], 1.0)
    idle, part, whole = _settle(backend, 60)
    assert idle["util"] < part["util"] < whole["util"]
    assert idle["power_w"] < part["power_w"] < whole["power_w"]
    assert idle["temp_c"] < whole["temp_c"]
    assert idle["mem_used_mib"] < part["mem_used_mib"] < whole["mem_used_mib"]
    assert whole["util"] > 80
    backend.set_busy(big, full["instance_uuid"], False)
    assert _settle(backend, 60)[2]["util"] < 10


def test_whole_gpu_models_take_load_on_the_gpu_itself():
    backend, gpus = make("l4:1")
    backend.set_busy(gpus[0]["uuid"], gpus[0]["uuid"], True)
    assert _settle(backend)[0]["util"] > 80


def test_overheat_fault_drives_temperature_past_90_and_clocks_down_until_cleared():
    backend, gpus = make("l4:1")
    gpu = gpus[0]["uuid"]
    backend.set_busy(gpu, gpu, True)
    cool = _settle(backend)[0]
    backend.inject_fault(gpu, "overheat")
    hot = None
    for _ in range(100):
        reading = backend.sample()[0]
        if reading["temp_c"] > 90:
            hot = reading
            break
    assert hot is not None, "temperature never passed 90 °C"
    assert hot["sm_clock_mhz"] < cool["sm_clock_mhz"] * 0.9  # thermal slowdown
    backend.inject_fault(gpu, "clear")
    backend.set_busy(gpu, gpu, False)
    assert _settle(backend, 80)[0]["temp_c"] < 50


def test_ecc_fault_counts_a_double_bit_error_and_xid_fault_is_reported_once():
    backend, gpus = make("h100-80gb:1")
    gpu = gpus[0]["uuid"]
    backend.inject_fault(gpu, "ecc")
    first = backend.sample()[0]
    assert first["ecc_dbe"] == 1 and 48 in first["xid"]
    backend.inject_fault(gpu, "xid")
    assert backend.sample()[0]["xid"] == [79]
    assert backend.sample()[0]["xid"] == []
    backend.inject_fault(gpu, "xid", xid=31)
    assert backend.sample()[0]["xid"] == [31]


@pytest.mark.parametrize("call", [
    lambda b, g: b.inject_fault(g, "melt"),
    lambda b, g: b.inject_fault(g, "xid", xid=-1),
    lambda b, g: b.set_busy(g, "MIG-none", True),
    lambda b, g: b.set_busy(g, g, 1.5),
])
def test_bad_simulation_commands_are_refused(call):
    backend, gpus = make("h100-80gb:1")
    with pytest.raises(BackendError):
        call(backend, gpus[0]["uuid"])


def test_same_seed_gives_the_same_metrics():
    a, _ = make(seed=3)
    b, _ = make(seed=3)
    assert _settle(a, 5) == _settle(b, 5)


def test_with_a_simulated_workload_new_instances_push_the_gpus_utilisation_up():
    from nodeagent.backends.simulated import SimulatedBackend

    idle = SimulatedBackend("h100-80gb:1", hostname="w", seed=3)
    busy = SimulatedBackend("h100-80gb:1", hostname="w", seed=3, busy_on_create=0.9)
    for backend in (idle, busy):
        gpu = backend.inventory()["gpus"][0]["uuid"]
        backend.create_instance(gpu, "7g.80gb", 0)
    for _ in range(60):  # utilisation follows load with some lag
        idle_util, busy_util = idle.sample()[0]["util"], busy.sample()[0]["util"]
    assert idle_util < 10 < 50 < busy_util


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_workload_share_outside_0_to_1_is_refused(share):
    from nodeagent.backends.simulated import SimulatedBackend

    with pytest.raises(ValueError):
        SimulatedBackend("l4:1", busy_on_create=share)


def test_with_a_state_file_a_restarted_machine_keeps_its_instances_as_a_gpu_does(tmp_path):
    from nodeagent.sim_state import StateFile

    state = StateFile(tmp_path / "node-a" / "state.json")
    first = SimulatedBackend("h100-80gb:2,l4:1", hostname="node-a", seed=7, state=state)
    gpu = first.inventory()["gpus"][0]["uuid"]
    kept = first.create_instance(gpu, "3g.40gb", 4)
    gone = first.create_instance(gpu, "1g.10gb", 0)
    first.destroy_instance(gpu, gone["instance_uuid"])
    again = SimulatedBackend("h100-80gb:2,l4:1", hostname="node-a", seed=7, state=StateFile(state.path))
    assert again.inventory()["gpus"][0]["instances"] == [
        {"uuid": kept["instance_uuid"], "profile": "3g.40gb", "start": 4, "size": 4}]
    with pytest.raises(BackendError) as exc:  # its memory slices are still taken
        again.create_instance(gpu, "3g.40gb", 4)
    assert exc.value.code == protocol.E_INSUFFICIENT
    # Without a state file the machine starts empty, as before.
    assert SimulatedBackend("h100-80gb:2,l4:1", hostname="node-a", seed=7).inventory()["gpus"][0]["instances"] == []


def test_a_state_file_that_is_not_json_is_refused_with_what_to_do(tmp_path):
    from nodeagent.sim_state import StateFile

    (tmp_path / "state.json").write_text("{half")
    with pytest.raises(ValueError, match="move it away"):
        SimulatedBackend("l4:1", hostname="node-a", state=StateFile(tmp_path / "state.json"))


def test_with_a_state_file_a_restarted_runtime_finds_its_containers(tmp_path):
    from nodeagent.runtime.base import WorkloadSpec
    from nodeagent.runtime.simulated import SimulatedRuntime
    from nodeagent.sim_state import StateFile

    state = StateFile(tmp_path / "state.json")
    first = SimulatedRuntime(state=state, pull_seconds=0, log_every=0.05)
    spec = WorkloadSpec(lease="L1", image="img:1", device_gpu="GPU-1", device_instance="MIG-1", cpus=1, memory_mb=512)
    started = first.start(spec)
    first.start(WorkloadSpec(**{**spec.__dict__, "lease": "L2"}))
    first.stop("L2", grace_seconds=0)
    frames = []
    again = SimulatedRuntime(report=frames.append, state=StateFile(state.path), pull_seconds=0, log_every=0.05)
    assert again.found() == [{"lease": "L1", "container": started["container"], "state": "running"}]
    assert again.start(spec) == {"container": started["container"], "state": "running"}  # adopted, not twice
    again.stop("L1", grace_seconds=0)
    assert again.found() == [] and SimulatedRuntime(state=StateFile(state.path)).found() == []


def test_the_backend_and_the_runtime_saving_the_same_state_file_at_once_lose_nothing(tmp_path):
    """Each save reads the whole file and writes it back: two StateFiles of one file (the backend's and the
    runtime's, saving from different threads) must not overwrite each other's section."""
    import threading

    from nodeagent.sim_state import StateFile

    path = tmp_path / "state.json"
    backend, runtime = StateFile(path), StateFile(path)

    def save(state, section):
        for i in range(200):
            state.save(section, i)

    threads = [threading.Thread(target=save, args=(backend, "instances")),
               threading.Thread(target=save, args=(runtime, "containers"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (StateFile(path).load("instances"), StateFile(path).load("containers")) == (199, 199)


def _util_after(backend, samples: int = 40) -> list[float]:
    for _ in range(samples):  # utilisation follows load with some lag
        out = backend.sample()
    return [g["util"] for g in out]


def test_a_load_file_written_while_the_machine_runs_drives_its_load_busy_then_idle(tmp_path):
    from nodeagent.backends.simulated import SimulatedBackend

    load = tmp_path / "load"
    backend = SimulatedBackend("l4:2", hostname="w", seed=3, load_file=str(load))
    assert max(_util_after(backend)) < 10  # no file yet: idle
    load.write_text("0.9")
    assert min(_util_after(backend)) > 70
    first = backend.inventory()["gpus"][0]["uuid"]
    load.write_text(json.dumps({"*": 0.0, first: 0.8}))
    busy, idle = _util_after(backend)
    assert busy > 60 and idle < 10


def test_a_load_file_sets_the_load_of_each_mig_instance_by_its_uuid(tmp_path):
    from nodeagent.backends.simulated import SimulatedBackend

    load = tmp_path / "load"
    backend = SimulatedBackend("h100-80gb:1", hostname="w", seed=3, load_file=str(load))
    gpu = backend.inventory()["gpus"][0]["uuid"]
    big = backend.create_instance(gpu, "4g.40gb", 0)["instance_uuid"]
    backend.create_instance(gpu, "3g.40gb", 4)
    load.write_text(json.dumps({"*": 0.0, big: 1.0}))
    (util,) = _util_after(backend)
    assert 45 < util < 65  # 4 of 7 compute slices busy


@pytest.mark.parametrize("text", ["", "busy", "1.5", '{"*": -1}', '{"*": true}'])
def test_a_malformed_load_file_is_refused_and_the_load_stays_as_it_was(tmp_path, text):
    from nodeagent.backends.simulated import SimulatedBackend, parse_load

    with pytest.raises(ValueError):
        parse_load(text)
    load = tmp_path / "load"
    load.write_text("1")
    backend = SimulatedBackend("l4:1", hostname="w", seed=3, load_file=str(load))
    assert _util_after(backend)[0] > 80
    load.write_text(text + " ")  # a different size: read again
    assert _util_after(backend)[0] > 80
