"""The agent's side of workloads, with the simulated runtime against the in-test gateway: start_workload answered
at once and the container's states following as frames, its output as bounded chunks, a job's exit, a notice, a
stop; an agent without an engine refusing in the result; a reconnecting agent naming the containers it runs; the
protocol refusing what it does not know."""
import pytest

from nodeagent import protocol
from nodeagent.commands import execute
from nodeagent.errors import BackendError
from nodeagent.runtime.base import NoRuntime, WorkloadSpec
from nodeagent.runtime.simulated import SimulatedRuntime
from tests.nodeagent.test_client import Gateway, running, until

LEASE = "0b0e6c1a-3a5e-4f57-9d5c-8e1f2a3b4c5d"


def spec(**kw) -> dict:
    base = {"image": "docker.io/library/ubuntu:24.04", "command": [], "args": [], "env": {"MODE": "train"},
            "secret_names": [], "ports": [{"container_port": 22, "host_port": 20000, "protocol": "tcp"}],
            "limits": {"cpus": 2.0, "memory_mb": 16384, "disk_gb": 20},
            "device": {"gpu_uuid": "GPU-1", "instance_uuid": "MIG-1"}, "ssh_keys": [], "notice": "sigterm",
            "kind": "interactive"}
    return {**base, **kw}


def states(gateway, lease=LEASE):
    return [f["state"] for f in gateway.of_type("workload") if f["lease"] == lease]


async def test_a_workload_starts_reports_its_states_and_output_takes_a_notice_and_stops():
    gateway = Gateway()
    runtime = SimulatedRuntime(pull_seconds=0, log_every=0.02, seed=1)
    async with running(gateway, runtime=runtime) as (agent, backend, task):
        await until(lambda: gateway.ws is not None)
        assert gateway.hellos[0]["runtime"] == "simulated" and gateway.hellos[0]["workloads"] == []
        await gateway.send(protocol.command(id="w1", op="start_workload", args={"lease": LEASE, "spec": spec()}))
        await until(lambda: gateway.results("w1"))
        assert gateway.results("w1")[0]["result"] == {"accepted": True, "runtime": "simulated"}
        await until(lambda: "running" in states(gateway) and len(gateway.of_type("logs")) >= 3)
        assert states(gateway)[:3] == ["pulling", "starting", "running"]
        assert "on MIG-1: 2 CPUs, 16384 MB" in gateway.of_type("logs")[0]["data"]
        await gateway.send(protocol.command(id="n1", op="notice", args={
            "kind": "spot_interruption:outbid", "deadline": "2026-11-30T12:00:00+00:00", "instance_uuid": "MIG-1",
            "lease": LEASE, "mode": "file"}))
        await until(lambda: gateway.results("n1"))
        assert gateway.results("n1")[0]["result"] == {"acknowledged": True, "delivered": True, "mode": "file"}
        await until(lambda: any("a notice file" in f["data"] for f in gateway.of_type("logs")))
        await gateway.send(protocol.command(id="s1", op="stop_workload", args={"lease": LEASE, "grace_seconds": 0}))
        await until(lambda: gateway.results("s1") and "removed" in states(gateway))
        assert gateway.results("s1")[0]["result"] == {"removed": True, "exit_code": 143}
        assert runtime.found() == []


async def test_a_job_exits_with_its_code_and_a_missing_image_fails_with_the_reason():
    gateway = Gateway()
    runtime = SimulatedRuntime(pull_seconds=0, log_every=0.01, seed=1)
    async with running(gateway, runtime=runtime) as (agent, backend, task):
        await until(lambda: gateway.ws is not None)
        job = spec(kind="job", env={"SIM_RUN_SECONDS": "0.05", "SIM_EXIT_CODE": "3"})
        await gateway.send(protocol.command(id="j1", op="start_workload", args={"lease": LEASE, "spec": job}))
        await until(lambda: "exited" in states(gateway))
        exited = [f for f in gateway.of_type("workload") if f["state"] == "exited"][0]
        assert exited["exit_code"] == 3
        other = "9f1e6c1a-3a5e-4f57-9d5c-8e1f2a3b4c5d"
        await gateway.send(protocol.command(id="j2", op="start_workload", args={
            "lease": other, "spec": spec(image="docker.io/me/app:missing")}))
        await until(lambda: "failed" in states(gateway, other))
        failed = [f for f in gateway.of_type("workload") if f["lease"] == other and f["state"] == "failed"][0]
        assert "could not be pulled" in failed["reason"]
        assert gateway.results("j2")[0]["ok"]  # accepted; the failure is the workload's, reported as it happened


async def test_a_reconnecting_agent_says_hello_with_the_containers_it_runs():
    gateway = Gateway(drop_first_after_welcome=True)
    runtime = SimulatedRuntime(pull_seconds=0, log_every=3600, seed=1)
    runtime.start(WorkloadSpec.from_command(LEASE, spec()))  # running before the agent (re)connects
    async with running(gateway, runtime=runtime) as (agent, backend, task):
        await until(lambda: len(gateway.hellos) == 2)
        assert [w["lease"] for w in gateway.hellos[1]["workloads"]] == [LEASE]
        assert gateway.hellos[1]["workloads"][0]["state"] == "running"


async def test_an_agent_without_an_engine_refuses_a_workload_in_the_result():
    with pytest.raises(BackendError) as err:
        await execute(None, "start_workload", {"lease": LEASE, "spec": spec()}, runtime=NoRuntime())
    assert err.value.code == protocol.E_NOT_SUPPORTED and "runs no container engine" in err.value.message


@pytest.mark.parametrize("bad", [
    {"image": "ubuntu 24.04"}, {"env": {"A": 1}}, {"ports": [{"container_port": 0, "host_port": 20000}]},
    {"limits": {"cpus": 0, "memory_mb": 16}}, {"notice": "email"}, {"kind": "batch"}, {"device": {}},
    {"secret_names": "HF_TOKEN"},
])
def test_a_workload_spec_the_agent_cannot_run_is_refused(bad):
    with pytest.raises(protocol.ProtocolError):
        protocol.validate_workload_spec(spec(**bad))


def test_frames_a_side_does_not_know_are_refused_with_a_clear_error():
    with pytest.raises(protocol.ProtocolError, match="unknown frame type 'telemetry'"):
        protocol.validate({"v": 1, "type": "telemetry"})
    with pytest.raises(protocol.ProtocolError, match="state is one of"):
        protocol.validate(protocol.workload(lease=LEASE, state="paused", at=1.0))
    with pytest.raises(protocol.ProtocolError, match="at most 16384 bytes"):
        protocol.validate(protocol.logs(lease=LEASE, data="x" * 20000))
