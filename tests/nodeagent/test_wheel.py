"""The agent's own wheel and systemd unit: what the wheel holds and requires, and an install into a fresh venv,
offline from the wheelhouse `make venv` downloads, whose `gpumarket-agent` brings a node online on a live server."""
from __future__ import annotations

import email.parser
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from nodeagent import cli
import nodeagent
from nodeagent.packaging import build
from tests.e2e.livestack import LiveStack, ROOT, wait_until
from tests.wheels import absent, contents as wheel_contents, every_module_imports, install_alone, record_problems, run

AGENT_LIBRARIES = ["docker", "nvidia-ml-py", "websockets"]  # the list: nothing of the web application
UNIT = ROOT / "nodeagent" / "packaging" / "gpumarket-agent.service"
DIST_INFO = f"gpumarket_agent-{nodeagent.__version__}.dist-info"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build.build_wheel(tmp_path_factory.mktemp("dist"))


def _read(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as whl:
        return whl.read(name).decode()


def test_the_wheel_requires_exactly_the_agents_three_libraries_at_versions_the_server_pins(wheel):
    assert wheel.name == f"gpumarket_agent-{nodeagent.__version__}-py3-none-any.whl"
    meta = email.parser.Parser().parsestr(_read(wheel, f"{DIST_INFO}/METADATA"))
    assert (meta["Name"], meta["Version"], meta["Requires-Python"]) == (
        "gpumarket-agent", nodeagent.__version__, ">=3.11")
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    assert sorted(r.name for r in requires) == AGENT_LIBRARIES
    pinned = dict(line.split("==") for line in subprocess.run(
        [sys.executable, "-m", "nodeagent.packaging.build", "--pins"], cwd=ROOT, capture_output=True, text=True,
        check=True).stdout.split())
    assert sorted(pinned) == AGENT_LIBRARIES
    requirements_txt = (ROOT / "requirements.txt").read_text()
    for r in requires:
        assert re.search(rf"^{re.escape(r.name)}=={re.escape(pinned[r.name])}\b", requirements_txt, re.M)
        assert r.specifier.contains(pinned[r.name]), f"{r} refuses the version the server's tests run"


def test_the_wheel_holds_the_agents_modules_and_unit_under_true_hashes_and_a_console_script(wheel):
    contents = wheel_contents(wheel)
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "nodeagent").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert {n for n in contents if not n.startswith(DIST_INFO)} == sources | {
        "nodeagent/packaging/gpumarket-agent.service"}
    assert record_problems(contents, DIST_INFO) == []
    assert "Root-Is-Purelib: true\n" in contents[f"{DIST_INFO}/WHEEL"].decode()
    assert "Tag: py3-none-any\n" in contents[f"{DIST_INFO}/WHEEL"].decode()
    assert contents[f"{DIST_INFO}/entry_points.txt"].decode() == (
        "[console_scripts]\ngpumarket-agent = nodeagent.cli:main\n")


def test_two_builds_of_one_tree_are_the_same_bytes(wheel, tmp_path):
    out = subprocess.run([sys.executable, "-m", "nodeagent.packaging.build", "--out", str(tmp_path / "again")],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).read_bytes() == wheel.read_bytes()
    with zipfile.ZipFile(wheel) as whl:
        assert {info.date_time for info in whl.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_the_build_refuses_a_requirements_file_that_does_not_pin_an_agent_library(tmp_path):
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("websockets==17.4\nnvidia-ml-py==13.615.71\ndocker>=7  # not a pin\n")
    with pytest.raises(build.BuildError, match="pins none of docker"):
        build.pins(reqs)


# --- the systemd unit ----------------------------------------------------------------------------------------------

def _unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """section -> key -> values, in order (systemd keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key, []).append(value)
    return sections


def _exec_start(service: dict[str, list[str]], env_file: dict[str, str]) -> list[str]:
    """ExecStart as systemd runs it: `${NAME}` is one word, a bare `$NAME` splits at spaces (systemd.service(5)).
    The env file's values win over Environment= (systemd.exec(5))."""
    env = dict(v.split("=", 1) for v in service.get("Environment", [])) | env_file
    words = []
    for word in shlex.split(service["ExecStart"][0]):
        if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", word):
            words += env.get(word[1:], "").split()
        else:
            words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m[1], ""), word))
    return words


def test_the_unit_restarts_takes_its_token_from_the_env_file_and_runs_the_installed_agent_on_docker():
    unit = _unit(UNIT)
    service = unit["Service"]
    assert service["Restart"] == ["always"] and float(service["RestartSec"][0]) > 0
    assert service["EnvironmentFile"] == ["/etc/gpumarket/agent.env"]
    after = " ".join(unit["Unit"]["After"]).split()
    assert "network-online.target" in after and "docker.service" in after
    assert "PrivateDevices" not in service and "DevicePolicy" not in service  # NVML opens /dev/nvidia*
    assert "User" not in service  # MIG changes and the engine's socket are root's
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]

    argv = _exec_start(service, {"NODEAGENT_SERVER": "wss://market.example.org/ws/agent/",
                                 "NODEAGENT_TOKEN": "gpm_node_x"})
    # The console script the wheel installs, in the venv docs/deployment.md makes.
    assert argv[0] == "/opt/gpumarket-agent/bin/" + build.AGENT.console_script.split(" = ")[0]
    args = cli.build_parser().parse_args(argv[1:])
    assert (args.servers, args.runtime, args.engine_url) == (
        ["wss://market.example.org/ws/agent/"], "docker", "unix:///run/docker.sock")
    assert args.token is None  # from the environment, not a command line other users can read

    podman = _exec_start(service, {"NODEAGENT_SERVER": "wss://market.example.org/ws/agent/",
                                   "NODEAGENT_ENGINE_URL": "unix:///run/podman/podman.sock",
                                   "NODEAGENT_ARGS": "--gpu-devices request --hostname rack1-n3"})
    args = cli.build_parser().parse_args(podman[1:])
    assert (args.engine_url, args.gpu_devices, args.hostname) == (
        "unix:///run/podman/podman.sock", "request", "rack1-n3")


# --- installed alone -----------------------------------------------------------------------------------------------

@pytest.mark.e2e
def test_the_wheel_installs_alone_offline_and_its_agent_brings_a_simulated_node_online(wheel, tmp_path):
    bin_dir = install_alone(wheel, tmp_path / "agent-venv")
    python = bin_dir / "python"
    for module in ("django", "scheduler"):
        assert absent(python, module, tmp_path), f"{module} is importable"
    assert every_module_imports(python, "nodeagent", tmp_path).is_relative_to(tmp_path / "agent-venv")
    venv = tmp_path / "agent-venv"
    # Where docs/deployment.md copies the systemd unit from.
    assert [u.read_bytes() for u in venv.glob("lib/python3*/site-packages/nodeagent/packaging/*.service")] == [
        UNIT.read_bytes()]
    agent = str(bin_dir / "gpumarket-agent")
    assert run(agent, "--version", cwd=tmp_path).stdout.strip() == f"nodeagent {nodeagent.__version__}"

    stack = LiveStack(tmp_path / "stack", nodes=[("wheel-a100", "a100-80gb:1")], celery=False, start_agents=False,
                      agent_interval=0.5)
    (tmp_path / "stack").mkdir()
    with stack.running():
        node = stack.seed["nodes"][0]
        stack.start_agent(node, command=(agent, "--runtime", "simulated"), env={"PYTHONPATH": ""})

        def online():
            _, body = stack.api("GET", f"/api/v1/nodes/{node['id']}/")
            return body if body.get("status") == "online" and body.get("gpu_count") == 1 else None
        body = wait_until(online, timeout=60, what="the installed agent's node to come online")
        assert (body["backend"], body["agent_version"]) == ("simulated", nodeagent.__version__)
        out = stack._run("manage.py", "shell", "-c", "from scheduler.models import Node; "
                         f"print('RUNTIME=' + Node.objects.get(pk={node['id']!r}).runtime)")
        assert "RUNTIME=simulated" in out
