"""A real container engine for the tests that run containers (tests/engine, the browser's workload flow):
$CONTAINER_ENGINE_URL when set, else a `podman system service` started for the session on a socket of its own.
Without podman the tests are skipped with the reason, unless GPUMARKET_REQUIRE_ENGINE=1 (CI), where that is a
failure. The test images are built on it without a registry (tests/engine/images.py).

Every container the tests make is labelled with this session's own node (`engine_node`), and removed at the end.
The fixtures are registered for all tests in tests/conftest.py.
"""
from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeagent.runtime.base import LABEL_LEASE, LABEL_NODE

from tests.engine import images

ENGINE_URL_ENV = "CONTAINER_ENGINE_URL"
REQUIRE_ENV = "GPUMARKET_REQUIRE_ENGINE"
ENGINE_START_SECONDS = 30.0

# A service of the tests' own reads only this configuration, so the host's needs no editing: runc where it is
# installed and no default ulimits, the settings docs/deployment.md gives for hosts where crun fails.
CONTAINERS_CONF = """[containers]
default_ulimits = []
{engine}"""


def unavailable(reason: str) -> None:
    """Skip, or in CI (GPUMARKET_REQUIRE_ENGINE=1) fail: the engine tests must run there."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: the engine tests must run here)", pytrace=False)
    pytest.skip(reason)


def _answers(url: str) -> bool:
    import docker

    try:
        client = docker.APIClient(base_url=url, version="1.41", timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _start_podman_service(podman: str, folder: Path) -> tuple[subprocess.Popen, str, Path]:
    conf = folder / "containers.conf"
    conf.write_text(CONTAINERS_CONF.format(
        engine='[engine]\nruntime = "runc"\n' if shutil.which("runc") else ""))
    sock, log_path = folder / "podman.sock", folder / "service.log"
    url = f"unix://{sock}"
    with open(log_path, "wb") as log_file:
        service = subprocess.Popen([podman, "system", "service", "--time=0", url], stdout=log_file,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                   env={**os.environ, "CONTAINERS_CONF": str(conf)})
    return service, url, log_path


@pytest.fixture(scope="session")
def engine_url(tmp_path_factory):
    """The Docker Engine API the tests talk to (a unix:// or tcp:// URL)."""
    pytest.importorskip("docker", reason="the docker SDK is not installed (requirements.txt)")
    url = os.environ.get(ENGINE_URL_ENV)
    if url:
        if not _answers(url):
            unavailable(f"no container engine answers at ${ENGINE_URL_ENV}={url}")
        yield url
        return
    podman = shutil.which("podman")
    if podman is None:
        unavailable(f"podman is not installed (apt-get install podman runc) and ${ENGINE_URL_ENV} is not set")
    folder = tmp_path_factory.mktemp("podman")
    service, url, log_path = _start_podman_service(podman, folder)
    try:
        deadline = time.monotonic() + ENGINE_START_SECONDS
        while not _answers(url):
            if service.poll() is not None or time.monotonic() > deadline:
                unavailable(f"`podman system service` did not answer at {url}: "
                            f"{log_path.read_text(errors='replace')[-1500:] or 'no output'}")
            time.sleep(0.1)
        yield url
    finally:
        service.terminate()
        try:
            service.wait(timeout=10)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()


@pytest.fixture(scope="session")
def engine_node() -> str:
    """This session's node label: what the tests made, and only that, is theirs to remove."""
    return f"gpm-test-{uuid.uuid4().hex[:10]}"


def remove_ours(client, node: str) -> None:
    from nodeagent.runtime.docker import listed_containers

    for listed in listed_containers(client, {"label": f"{LABEL_NODE}={node}"}):
        if LABEL_LEASE in listed["labels"]:
            remove_quietly(client, listed["id"])


def remove_quietly(client, container_id: str) -> None:
    import docker

    try:
        client.api.remove_container(container_id, v=True, force=True)
    except docker.errors.APIError:  # already gone (Podman may answer a 500 for a container removed meanwhile)
        pass


@pytest.fixture(scope="session")
def engine(engine_url, engine_node):
    """A docker.DockerClient on the engine; the session's containers are gone when it ends."""
    import docker

    client = docker.DockerClient(base_url=engine_url, timeout=60)
    yield client
    remove_ours(client, engine_node)
    client.close()


def _image(client, build: Callable[[Any], str]) -> str:
    missing = images.have_tools()
    if missing:
        unavailable(f"the test images cannot be built: {missing}")
    return build(client)


@pytest.fixture(scope="session")
def busybox_image(engine) -> str:
    return _image(engine, images.busybox_image)


@pytest.fixture(scope="session")
def sshd_image(engine) -> str:
    return _image(engine, images.sshd_image)


# --- what a buyer of a container does on this machine --------------------------------------------------------

def free_port_block(size: int) -> tuple[int, int]:
    """A run of `size` ports free on loopback now, for the nodes' host port range."""
    for _ in range(200):
        start = random.randrange(20000, 32000 - size)
        if all(_free(p) for p in range(start, start + size)):
            return start, start + size - 1
    raise RuntimeError("no free block of ports on loopback")


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def ssh_keypair(folder, name: str) -> tuple[str, str]:
    """(private key path, public key line) of a new ed25519 key: what a buyer has on their laptop."""
    if not (shutil.which("ssh-keygen") and shutil.which("ssh")):
        unavailable("the OpenSSH client is not installed (apt-get install openssh-client)")
    path = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@e2e", "-f", str(path)], check=True)
    return str(path), (folder / f"{name}.pub").read_text().strip()


def ssh(key_path: str, command: str, ssh_line: str) -> subprocess.CompletedProcess:
    """Run `command` through the lease's `ssh -p PORT root@HOST` line with the key at `key_path`."""
    port, host = ssh_line.split()[2], ssh_line.split()[3]
    return subprocess.run(["ssh", "-i", key_path, "-p", port, "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                           "-o", "IdentitiesOnly=yes", host, command], capture_output=True, text=True, timeout=30)
