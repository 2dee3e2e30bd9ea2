"""DockerRuntime against a real engine (conftest: Podman's service, or $CONTAINER_ENGINE_URL): the buyer's HTTP
and SSH reach the container, a job's exit and output are reported with the engine's times, spot notices arrive,
stop leaves nothing behind, a restarted agent adopts, and what the engine is asked for is what the spec says.
The GPU requests, which need an NVIDIA host, are checked as the request body the SDK would send."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

from nodeagent.errors import BackendError
from nodeagent.runtime.base import (
    LABEL_KIND,
    LABEL_LEASE,
    LABEL_NODE,
    NOTICE_PATH,
    WorkloadSpec,
    container_name,
)
from tests.e2e.livestack import free_port, wait_until

from . import images
from tests.enginefix import unavailable

from .conftest import INSTANCE_UUID, Frames, workload_spec


def _spec(lease: str, image: str, **kw) -> WorkloadSpec:
    return WorkloadSpec.from_command(lease, workload_spec(image, **kw))


def _loop(*lines: str) -> list[str]:
    """A shell command: `lines`, then idle until killed (short sleeps, so a trap runs soon after its signal)."""
    return ["sh", "-c", "; ".join([*lines, "while true; do sleep 0.2; done"])]


def _gone(engine, lease: str) -> bool:
    import docker

    try:
        engine.containers.get(container_name(lease))
    except docker.errors.NotFound:
        return True
    return False


# --- the buyer's access -----------------------------------------------------------------------------------------

def test_an_interactive_container_serves_http_on_its_published_port(runtime, frames, busybox_image, lease):
    port = free_port()
    result = runtime.start(_spec(lease, busybox_image, ports=[{"container_port": images.HTTP_PORT,
                                                              "host_port": port}]))

    assert result["state"] == "running"
    assert frames.states(lease) == ["starting", "running"]  # the image is here: nothing to pull
    assert frames.wait_state(lease, "running")["container"] == result["container"]

    def get():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=2) as answer:
                return answer.read()
        except (urllib.error.URLError, ConnectionError):
            return None

    assert wait_until(get, timeout=10, what=f"HTTP on 127.0.0.1:{port}") == images.INDEX_HTML


def _ssh_keypair(folder, name: str) -> tuple[str, str]:
    key = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    return str(key), (folder / f"{name}.pub").read_text().strip()


def _ssh(key: str, port: int, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-i", key, "-p", str(port), "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                           "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR", "root@127.0.0.1", command],
                          check=False, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


def test_the_buyers_ssh_key_logs_in_and_another_key_is_refused(runtime, engine, sshd_image, lease, tmp_path):
    if not (shutil.which("ssh") and shutil.which("ssh-keygen")):
        unavailable("ssh and ssh-keygen are missing (apt-get install openssh-client)")
    key, public = _ssh_keypair(tmp_path, "buyer")
    wrong_key, _ = _ssh_keypair(tmp_path, "stranger")
    port = free_port()
    runtime.start(_spec(lease, sshd_image, ports=[{"container_port": images.SSH_PORT, "host_port": port}],
                        ssh_keys=[public]))

    login = wait_until(lambda: (r := _ssh(key, port, "echo ok")).returncode == 0 and r, timeout=15,
                   what=f"an SSH login on port {port}")
    assert login.stdout.strip() == "ok"
    refused = _ssh(wrong_key, port, "echo ok")
    assert refused.returncode != 0 and "ok" not in refused.stdout
    assert "Permission denied" in refused.stderr
    # What dropbear (and OpenSSH's StrictModes) insist on: nobody but root can write on the way to the keys.
    modes = engine.containers.get(container_name(lease)).exec_run(
        ["stat", "-c", "%a %u %n", "/root", "/root/.ssh", "/root/.ssh/authorized_keys"]).output.decode().split("\n")
    assert modes[:3] == ["700 0 /root", "700 0 /root/.ssh", "600 0 /root/.ssh/authorized_keys"]


# --- jobs, output and exits -------------------------------------------------------------------------------------

def test_a_job_reports_its_output_and_exit_code_at_the_engines_times(runtime, frames, busybox_image, lease):
    runtime.start(_spec(lease, busybox_image, command=["sh", "-c", "echo hi; sleep 2; exit 3"], kind="job",
                        max_seconds=60))

    exited = frames.wait_state(lease, "exited", timeout=15)
    running = frames.wait_state(lease, "running")
    assert exited["exit_code"] == 3
    assert "hi" in frames.output(lease)
    assert 1.5 <= exited["at"] - running["at"] <= 3.5  # StartedAt and FinishedAt, not when the agent noticed
    assert frames.states(lease) == ["starting", "running", "exited"]


def test_a_job_that_exits_at_once_is_reported_exited_with_its_output_not_failed(runtime, frames, busybox_image,
                                                                                lease):
    runtime.start(_spec(lease, busybox_image, command=["sh", "-c", "echo fast; exit 0"], kind="job"))

    assert frames.wait_state(lease, "exited")["exit_code"] == 0
    assert frames.wait_output(lease, "fast")
    assert "failed" not in frames.states(lease)


def test_output_is_sent_while_the_container_keeps_running_and_within_the_frame_limit(runtime, frames,
                                                                                    busybox_image, lease):
    # 40 KB at once, then silence: every byte arrives without waiting for more output, in frames the server takes
    # (the collector validates each), none over the protocol's chunk limit even for multi-byte characters.
    runtime.start(_spec(lease, busybox_image, command=_loop("printf 'é%.0s' $(seq 20000)", "echo; echo done")))

    frames.wait_output(lease, "done")
    assert frames.output(lease).count("é") == 20000
    assert len([f for f in frames.all(lease) if f["type"] == "logs"]) >= 3


# --- spot notices -----------------------------------------------------------------------------------------------

def test_a_sigterm_notice_reaches_the_containers_trap(runtime, frames, busybox_image, lease):
    runtime.start(_spec(lease, busybox_image, command=_loop('trap "echo got-term; exit 0" TERM', "echo ready")))
    frames.wait_output(lease, "ready")

    assert runtime.notice(lease, "sigterm", "2026-12-01T10:00:00Z", "spot_interruption") == \
        {"delivered": True, "mode": "sigterm"}

    frames.wait_output(lease, "got-term")
    assert frames.wait_state(lease, "exited")["exit_code"] == 0  # it chose to leave; nobody stopped it


def test_a_file_notice_appears_inside_the_container(runtime, frames, busybox_image, lease):
    runtime.start(_spec(lease, busybox_image, notice="file", command=_loop(
        "echo ready", f"while [ ! -f {NOTICE_PATH} ]; do sleep 0.2; done", f"echo notice:$(cat {NOTICE_PATH})")))
    frames.wait_output(lease, "ready")

    runtime.notice(lease, "file", "2026-12-01T10:00:00Z", "spot_interruption")

    line = frames.wait_output(lease, "notice:").split("notice:", 1)[1].splitlines()[0]
    assert json.loads(line) == {"kind": "spot_interruption", "deadline": "2026-12-01T10:00:00Z"}
    assert frames.states(lease)[-1] == "running"  # a file notice leaves it running


# --- stop -------------------------------------------------------------------------------------------------------

def _volumes(engine, lease: str) -> list[str]:
    mounts = engine.api.inspect_container(container_name(lease))["Mounts"]
    return [m["Name"] for m in mounts if m.get("Type") == "volume"]


def _volume_gone(engine, name: str) -> bool:
    import docker

    try:
        engine.volumes.get(name)
    except docker.errors.NotFound:
        return True
    return False


def test_stop_kills_a_container_that_ignores_sigterm_after_the_grace_and_leaves_nothing(runtime, frames, engine,
                                                                                        busybox_image, lease):
    runtime.start(_spec(lease, busybox_image, command=_loop('trap "" TERM', "echo ready")))
    frames.wait_output(lease, "ready")
    volumes = _volumes(engine, lease)
    assert volumes  # the image's VOLUME /data: an anonymous volume that must go with it

    began = time.monotonic()
    result = runtime.stop(lease, grace_seconds=1)
    took = time.monotonic() - began

    assert result == {"removed": True, "exit_code": 137}  # SIGKILL
    assert 0.9 <= took < 10
    assert _gone(engine, lease)
    assert all(_volume_gone(engine, name) for name in volumes)
    assert frames.wait_state(lease, "removed")["exit_code"] == 137


def test_stop_lets_a_container_that_handles_sigterm_leave_within_the_grace(runtime, frames, engine, busybox_image,
                                                                           lease):
    runtime.start(_spec(lease, busybox_image, command=_loop('trap "echo bye; exit 0" TERM', "echo ready")))
    frames.wait_output(lease, "ready")

    began = time.monotonic()
    result = runtime.stop(lease, grace_seconds=5)

    assert time.monotonic() - began < 4
    assert result == {"removed": True, "exit_code": 0}
    assert _gone(engine, lease)
    assert frames.states(lease)[-1] == "removed"


# --- a restarted agent ------------------------------------------------------------------------------------------

def test_a_restarted_agent_adopts_its_running_container_and_removes_unlabelled_leftovers(make_runtime, frames, engine,
                                                                                         busybox_image, lease):
    spec = _spec(lease, busybox_image, command=["sh", "-c", "echo once; while true; do echo tick; sleep 0.3; done"])
    first = make_runtime()
    container = first.start(spec)["container"]
    frames.wait_output(lease, "tick")
    first.close()  # the agent stops; its container carries on
    closed = time.monotonic()

    leftover = f"gpm-leftover-{uuid.uuid4().hex[:8]}"
    engine.containers.create(busybox_image, ["sleep", "30"], name=leftover)
    try:
        after_restart = Frames()
        second = make_runtime(report=after_restart)

        assert [w for w in second.found() if w["lease"] == lease] == \
            [{"lease": lease, "container": container, "state": "running"}]
        assert engine.containers.list(all=True, filters={"name": leftover}) == []
        assert second.start(spec) == {"container": container, "state": "running"}  # adopted, not started again
        assert [c.id for c in engine.containers.list(all=True, filters={"label": f"{LABEL_LEASE}={lease}"})] == \
            [container]
        after_restart.wait_output(lease, "tick")  # the new agent follows its output, from the adoption on
        assert "once" not in after_restart.output(lease)  # the server has that already

        second.stop(lease, grace_seconds=0)
        after_restart.wait_state(lease, "removed")
        # The closed runtime reports nothing more (beyond a chunk it was sending as it closed).
        assert frames.arrived_after(closed + 0.2) == []
    finally:
        for stray in engine.containers.list(all=True, filters={"name": leftover}):
            stray.remove(v=True, force=True)


# --- failures ---------------------------------------------------------------------------------------------------

def test_a_missing_image_fails_with_a_readable_reason_and_leaves_no_container(runtime, frames, engine, lease):
    with pytest.raises(BackendError) as failure:
        runtime.start(_spec(lease, "localhost/does-not-exist:1"))

    assert "localhost/does-not-exist:1 could not be pulled" in failure.value.message
    failed = frames.wait_state(lease, "failed")
    assert "localhost/does-not-exist:1" in failed["reason"]
    assert frames.states(lease) == ["pulling", "failed"]
    assert _gone(engine, lease)


def test_a_command_the_image_lacks_fails_with_the_engines_words_and_leaves_no_container(runtime, frames, engine,
                                                                                        busybox_image, lease):
    with pytest.raises(BackendError, match="the container did not start"):
        runtime.start(_spec(lease, busybox_image, command=["/no/such/program"]))

    assert "/no/such/program" in frames.wait_state(lease, "failed")["reason"]
    assert frames.states(lease) == ["starting", "failed"]
    assert _gone(engine, lease)


def test_a_start_the_engine_failed_on_its_side_is_tried_again_and_runs(runtime, frames, engine, busybox_image, lease,
                                                                       monkeypatch):
    """Podman under load can fail a start on its side ("passing bulk input to subprocess: write |1: broken pipe",
    a 500): the agent tries again rather than failing the buyer's lease at once."""
    import docker

    collection = docker.models.containers.ContainerCollection
    real_create, calls = collection.create, []

    def flaky_create(self, **kwargs):
        calls.append(kwargs["name"])
        if len(calls) == 1:
            response = type("Response", (), {"status_code": 500, "reason": "Internal Server Error"})()
            raise docker.errors.APIError("start", response=response,
                                         explanation="passing bulk input to subprocess: write |1: broken pipe")
        return real_create(self, **kwargs)

    monkeypatch.setattr(collection, "create", flaky_create)
    runtime.start(_spec(lease, busybox_image, command=["sleep", "30"]))
    assert frames.wait_state(lease, "running")
    assert len(calls) == 2 and frames.states(lease) == ["starting", "running"]
    runtime.stop(lease, grace_seconds=0)


# --- what the engine is asked for -------------------------------------------------------------------------------

def test_the_container_gets_the_specs_limits_labels_ports_and_device_and_nothing_more(runtime, engine, engine_node,
                                                                                    busybox_image, lease):
    port = free_port()
    runtime.start(_spec(lease, busybox_image, cpus=0.5, memory_mb=256, disk_gb=1, env={"BUYER": "yes"},
                        ports=[{"container_port": images.HTTP_PORT, "host_port": port}]))
    attrs = engine.api.inspect_container(container_name(lease))
    host = attrs["HostConfig"]

    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == host["MemorySwap"] == 256 * 2**20
    assert host["Privileged"] is False
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["PortBindings"] == {f"{images.HTTP_PORT}/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}
    assert not host.get("Devices") and not host.get("DeviceRequests")  # gpu_devices="none"
    assert attrs["Config"]["Labels"][LABEL_LEASE] == lease
    assert attrs["Config"]["Labels"][LABEL_NODE] == engine_node
    assert attrs["Config"]["Labels"][LABEL_KIND] == "interactive"
    env = dict(item.split("=", 1) for item in attrs["Config"]["Env"])
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == INSTANCE_UUID
    assert env["BUYER"] == "yes"
    # The disk limit where the storage driver can set one; otherwise it runs without (overlay without quotas).
    assert host.get("StorageOpt") == {"size": "1G"} or runtime.disk_limits == "off"
    # And inside: the kernel enforces no-new-privileges on its processes.
    status = engine.containers.get(container_name(lease)).exec_run(["cat", "/proc/1/status"]).output.decode()
    assert "NoNewPrivs:\t1" in status


# --- GPU requests, without an engine (these machines have no GPU) ---------------------------------------------

class _Sent(Exception):
    """The create request the SDK was about to send."""


class OfflineEngine:
    """A DockerRuntime whose engine is a version answer (name, version), and the body of the create request its
    SDK call would send: what the agent asks an engine for, on a machine without one."""

    def __init__(self, monkeypatch) -> None:
        self.docker = pytest.importorskip("docker")
        self.monkeypatch = monkeypatch

    def runtime(self, gpu_devices: str, engine: tuple[str, str] = ("Engine", "27.3.1"), report=None):
        from nodeagent.runtime.docker import DockerRuntime

        name, version = engine
        answer = {"Version": version, "ApiVersion": "1.43", "Components": [{"Name": name, "Version": version}]}
        self.monkeypatch.setattr(self.docker.APIClient, "version", lambda client, api_version=True: answer)
        return DockerRuntime("unix:///nonexistent/engine.sock", gpu_devices=gpu_devices, node="node-1",
                             report=report)

    def create_body(self, runtime, spec: WorkloadSpec) -> dict:
        def capture(client, config, name, platform=None):
            raise _Sent(config)

        self.monkeypatch.setattr(self.docker.APIClient, "create_container_from_config", capture)
        with pytest.raises(_Sent) as request:
            runtime.client.containers.create(**runtime.create_kwargs(spec))
        return request.value.args[0]


@pytest.fixture
def offline(monkeypatch) -> OfflineEngine:
    return OfflineEngine(monkeypatch)


def test_cdi_mode_asks_for_the_slices_cdi_device_as_a_cdi_device_request(offline):
    runtime = offline.runtime("cdi")
    spec = _spec("lease-1", "example/cuda:12")

    wanted = [{"Driver": "cdi", "Count": 0, "DeviceIDs": [f"nvidia.com/gpu={INSTANCE_UUID}"], "Capabilities": [],
               "Options": {}}]
    assert runtime.create_kwargs(spec)["device_requests"] == wanted
    host = offline.create_body(runtime, spec)["HostConfig"]
    assert host["DeviceRequests"] == wanted
    assert not host.get("Devices")  # a CDI name is no device path: engines stat it and refuse


def test_request_mode_asks_the_nvidia_driver_for_the_slices_uuid(offline):
    runtime = offline.runtime("request")
    spec = _spec("lease-1", "example/cuda:12")

    body = offline.create_body(runtime, spec)
    assert body["HostConfig"]["DeviceRequests"] == [
        {"Driver": "nvidia", "Count": 0, "DeviceIDs": [INSTANCE_UUID], "Capabilities": [["gpu"]], "Options": {}}]
    assert f"NVIDIA_VISIBLE_DEVICES={INSTANCE_UUID}" in body["Env"]
    assert body["HostConfig"]["SecurityOpt"] == ["no-new-privileges"] and not body["HostConfig"].get("Privileged")


def test_none_mode_asks_for_no_device(offline):
    host = offline.create_body(offline.runtime("none"), _spec("lease-1", "example/cuda:12"))["HostConfig"]
    assert not host.get("DeviceRequests") and not host.get("Devices")


@pytest.mark.parametrize("engine, gpu_devices, refused", [
    (("Engine", "27.3.1"), "cdi", False),
    (("Engine", "24.0.7"), "request", False),
    (("Podman Engine", "5.4.0"), "cdi", False),
    (("Podman Engine", "5.10.2"), "cdi", False),
    (("Podman Engine", "4.3.1"), "cdi", True),  # drops the cdi request: the container would run GPU-less
    (("Podman Engine", "5.4.0"), "request", True),  # drops every "nvidia" request
    (("Podman Engine", "4.3.1"), "none", False),
])
def test_an_engine_that_would_drop_the_gpu_request_is_refused_gpu_workloads(offline, engine, gpu_devices, refused):
    frames = Frames()
    runtime = offline.runtime(gpu_devices, engine, report=frames)
    assert bool(runtime.gpu_refusal) is refused
    if refused:
        with pytest.raises(BackendError, match="without their GPU"):
            runtime.start(_spec("lease-1", "example/cuda:12"))
        assert "without their GPU" in frames.wait_state("lease-1", "failed")["reason"]
    assert not frames.invalid


@pytest.mark.parametrize("text, seconds", [
    ("2026-11-30T21:06:21.356034224Z", 1796072781.356034),  # Docker: UTC, nanoseconds
    ("2026-11-30T22:06:21.356034224+01:00", 1796072781.356034),  # Podman in another time zone
    ("2026-11-30T21:06:21Z", 1796072781.0),
    ("2026-11-30T16:06:21-05:00", 1796072781.0),
    ("0001-01-01T00:00:00Z", None),  # never started
    ("", None),
    ("yesterday", None),
])
def test_engine_timestamps_are_read_in_their_own_time_zone(text, seconds):
    from nodeagent.runtime.docker import _ts

    read = _ts(text)
    assert read is None if seconds is None else read == pytest.approx(seconds, abs=1e-6)
