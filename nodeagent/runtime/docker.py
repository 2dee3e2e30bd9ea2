"""A lease's container on a real engine, over the Docker Engine API (the `docker` SDK): Docker, or Podman through
`podman system service` (on hosts where crun fails, configure `runtime = "runc"` and an empty `default_ulimits`
in /etc/containers/containers.conf; docs/deployment.md).

The container gets the lease's GPU only: on an NVIDIA host the MIG device (or the whole GPU) through the NVIDIA
Container Toolkit — the CDI device `nvidia.com/gpu=<uuid>` (`--gpu-devices cdi`, the default), which the Engine API
takes as a device request of driver "cdi" (Docker 25+ with CDI on, the default from 28.2; Podman 5.4+), or an
"nvidia" device request for the UUID (`--gpu-devices request`, Docker with the toolkit's runtime) — plus
NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES; `--gpu-devices none` attaches nothing (simulated GPUs). On a Podman
that would drop the request and run the container without its GPU (older than 5.4, or any for "nvidia"
requests), GPU workloads fail with that reason.

Its CPU and memory limits come from the slice's share of the GPU (the node's CPUs and RAM per GPU, sent by the
server), its disk from the spec where the storage driver supports a size; it runs unprivileged with
no-new-privileges, its ports published on the agent's bind address, and it is labelled with its lease and node.
The buyer's SSH keys are written to /root/.ssh/authorized_keys before it starts, root's alone as sshd and dropbear
insist (and are in SSH_PUBLIC_KEYS for images that read them from the environment).

Its output goes to the server in chunks of at most LOG_CHUNK_BYTES, each within LOG_FLUSH_SECONDS of its first
byte, and its exit with the engine's code and times. One that is done by the time it has started is reported
running, then exited, when its code is 0 (a short job), and failed with its last lines otherwise. An agent that
restarts adopts its running containers and streams their output from then on (what they wrote while no agent
watched stays in the engine's log).
"""
from __future__ import annotations

import codecs
import io
import json
import logging
import queue
import re
import tarfile
import threading
import time
from datetime import datetime
from typing import Any

from .. import protocol
from ..errors import BackendError
from .base import LABEL_KIND, LABEL_LEASE, LABEL_NODE, NAME_PREFIX, NOTICE_PATH, Report, Runtime, WorkloadSpec
from .base import container_name, state

log = logging.getLogger(__name__)

GPU_DEVICE_MODES = ("cdi", "request", "none")
DISK_LIMIT_MODES = ("auto", "on", "off")
LOG_CHUNK_BYTES = 8 * 1024
LOG_FLUSH_SECONDS = 0.5


class EngineUnavailable(Exception):
    """The engine does not answer at the URL given (the agent says so and exits)."""


_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?$")


def _ts(text: str | None) -> float | None:
    """An engine timestamp as seconds since the epoch: RFC 3339 with nanoseconds, in UTC ("...05.26452551Z", Docker)
    or with the engine's offset ("...05.264525515+01:00", Podman in another time zone)."""
    found = _TIMESTAMP.match(text or "")
    if not found or text.startswith("0001-"):  # never started / never finished
        return None
    whole, frac, zone = found.groups()
    zone = "+00:00" if zone in (None, "Z") else zone
    try:
        base = datetime.fromisoformat(whole + zone).timestamp()
    except ValueError:
        return None
    return base + (float("0" + frac[:7]) if frac else 0.0)


def _utf8_chunks(text: str, limit: int) -> list[str]:
    """`text` cut into pieces of at most `limit` bytes of UTF-8, never inside a character."""
    data, out = text.encode(), []
    while data:
        cut = min(limit, len(data))
        while cut < len(data) and data[cut] & 0xC0 == 0x80:  # a continuation byte: back to the character's start
            cut -= 1
        out.append(data[:cut].decode())
        data = data[cut:]
    return out


def _tar(files: dict[str, tuple[bytes, int]], dirs: dict[str, int]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, mode in dirs.items():
            info = tarfile.TarInfo(path)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
            tar.addfile(info)
        for path, (data, mode) in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _why(exc: Exception) -> str:
    """What the engine said, without the SDK's request line where it gave an explanation."""
    return str(getattr(exc, "explanation", None) or exc)


class DockerRuntime(Runtime):
    name = "docker"

    def __init__(self, engine_url: str, *, gpu_devices: str = "cdi", bind_address: str = "0.0.0.0",
                 disk_limits: str = "auto", report: Report | None = None, node: str = "") -> None:
        super().__init__(report, node)
        if gpu_devices not in GPU_DEVICE_MODES:
            raise ValueError(f"gpu_devices is one of {', '.join(GPU_DEVICE_MODES)}")
        if disk_limits not in DISK_LIMIT_MODES:
            raise ValueError(f"disk_limits is one of {', '.join(DISK_LIMIT_MODES)}")
        import docker
        import requests

        self._docker = docker
        # What talking to the engine can raise: its refusals, and a connection that drops or times out.
        self._engine_errors = (docker.errors.DockerException, requests.exceptions.RequestException)
        self.engine_url, self.gpu_devices, self.bind_address = engine_url, gpu_devices, bind_address
        self.disk_limits = disk_limits
        try:
            self.client = docker.DockerClient(base_url=engine_url, timeout=120)
            version = self.client.version()
        except Exception as exc:  # connection refused, no socket, not an engine
            raise EngineUnavailable(f"no container engine answers at {engine_url}: {exc}") from None
        components = version.get("Components") or [{}]
        self.engine = f"{components[0].get('Name', 'Docker Engine')} {version.get('Version', '?')}"
        self.gpu_refusal = self._drops_gpu_requests(components[0].get("Name", ""), version.get("Version", ""))
        if self.gpu_refusal:
            log.warning("%s", self.gpu_refusal)
        self._lock = threading.Lock()
        self._busy: set[str] = set()  # leases being started (a second start for one waits its turn)
        self._watched: set[str] = set()
        self._closed = threading.Event()

    def _drops_gpu_requests(self, engine: str, version: str) -> str | None:
        """Why this engine would run a container without the GPU it is asked for, or None. Podman's Docker API
        ignores device requests it does not know instead of refusing them: "cdi" ones before 5.4
        (containers/podman#25171), "nvidia" ones in every release (containers/podman#22645)."""
        if self.gpu_devices == "none" or "podman" not in engine.lower():
            return None
        if self.gpu_devices == "request":
            return (f"{self.engine} ignores \"nvidia\" device requests, so containers would run without their GPU: "
                    f"use --gpu-devices cdi (Podman 5.4 or later)")
        if tuple(int(n) for n in re.findall(r"\d+", version)[:2]) < (5, 4):
            return (f"{self.engine} ignores CDI device requests (before Podman 5.4), so containers would run without "
                    f"their GPU: upgrade Podman, or run Docker 25 or later")
        return None

    # --- what the engine is asked for ------------------------------------------------------------------------

    def create_kwargs(self, spec: WorkloadSpec) -> dict[str, Any]:
        """The container's creation, as passed to the SDK (tests assert on it: the device, the limits)."""
        kw: dict[str, Any] = {
            "image": spec.image, "name": container_name(spec.lease), "detach": True,
            "labels": {LABEL_LEASE: spec.lease, LABEL_NODE: self.node, LABEL_KIND: spec.kind},
            "environment": spec.environment(),
            "privileged": False, "security_opt": ["no-new-privileges"],
            "nano_cpus": int(round(spec.cpus * 1e9)),
            "mem_limit": f"{spec.memory_mb}m", "memswap_limit": f"{spec.memory_mb}m",  # no swap beyond it
            "ports": {f"{p['container_port']}/{p.get('protocol', 'tcp')}": (self.bind_address, p["host_port"])
                      for p in spec.ports},
            "stop_signal": "SIGTERM",
        }
        if spec.command:
            kw["entrypoint"] = spec.command
        if spec.args:
            kw["command"] = spec.args
        if spec.disk_gb and self.disk_limits != "off":
            kw["storage_opt"] = {"size": f"{spec.disk_gb}G"}
        if self.gpu_devices == "cdi":
            # The CLIs turn `--device nvidia.com/gpu=<uuid>` into this request; the API's `Devices` takes only
            # paths ("stat nvidia.com/gpu=...: no such file or directory").
            kw["device_requests"] = [self._docker.types.DeviceRequest(
                driver="cdi", device_ids=[f"nvidia.com/gpu={spec.device_instance}"])]
        elif self.gpu_devices == "request":
            kw["device_requests"] = [self._docker.types.DeviceRequest(
                driver="nvidia", device_ids=[spec.device_instance], capabilities=[["gpu"]])]
        return kw

    # --- start -------------------------------------------------------------------------------------------------

    def start(self, spec: WorkloadSpec) -> dict[str, Any]:
        if self.gpu_refusal:
            raise self._fail(spec.lease, self.gpu_refusal)
        with self._lock:
            if spec.lease in self._busy:
                return {"container": None, "state": "starting"}
            self._busy.add(spec.lease)
        try:
            existing = self._container(spec.lease)
            if existing is not None and existing.status == "created":
                # An agent that stopped between creating and starting it (its keys may be missing): anew.
                self._remove_quietly(container_name(spec.lease))
            elif existing is not None:  # a repeated start, or an agent that restarted: adopt, never duplicate
                return self._adopt(existing)
            return self._start(spec)
        finally:
            with self._lock:
                self._busy.discard(spec.lease)

    def _fail(self, lease: str, reason: str) -> BackendError:
        state(self.report, lease, "failed", reason=reason[:2000])
        return BackendError(protocol.E_INTERNAL, reason[:500])

    def _start(self, spec: WorkloadSpec) -> dict[str, Any]:
        errors = self._docker.errors
        try:
            self.client.images.get(spec.image)
        except errors.ImageNotFound:
            self._pull(spec)
        except self._engine_errors as exc:
            raise self._fail(spec.lease, f"the engine refused the image {spec.image}: {_why(exc)}")
        state(self.report, spec.lease, "starting")
        kwargs = self.create_kwargs(spec)
        for attempt, pause in enumerate((*START_RETRY_PAUSES, None)):
            try:
                container = self._create(kwargs)
                if spec.ssh_keys:
                    # sshd and dropbear refuse keys in a file, or under a directory, that others could write to.
                    keys = ("\n".join(spec.ssh_keys) + "\n").encode()
                    container.put_archive("/", _tar({"root/.ssh/authorized_keys": (keys, 0o600)},
                                                    {"root": 0o700, "root/.ssh": 0o700}))
                container.start()
                container.reload()
                break
            except self._engine_errors as exc:  # a missing command, a port taken, the engine gone or overloaded
                self._remove_quietly(container_name(spec.lease))
                if pause is None or not _transient(exc):
                    raise self._fail(spec.lease, f"the container did not start: {_why(exc)}")
                log.warning("starting the container of lease %s failed (%s); trying again in %g s", spec.lease,
                            _why(exc), pause)
                time.sleep(pause)
        st = container.attrs.get("State", {})
        if st.get("Status") != "running" and st.get("ExitCode"):
            # It died at start (a bad argument, a crash): a failure, with the code and its own last words.
            try:
                tail = container.logs(tail=20).decode("utf-8", "replace").strip()[-1500:]
            except self._engine_errors:
                tail = ""
            self._remove_quietly(container_name(spec.lease))
            raise self._fail(spec.lease, f"the container exited at start with code {st['ExitCode']}"
                                         + (f": {tail}" if tail else ""))
        # One that is done already with code 0 (a short job) is reported like any other: running from its start,
        # then, by the watcher, its output and its exit.
        state(self.report, spec.lease, "running", container=container.id, at=_ts(st.get("StartedAt")))
        self._watch(spec.lease, container)
        return {"container": container.id, "state": "running"}

    def _create(self, kwargs: dict):
        errors = self._docker.errors
        try:
            return self.client.containers.create(**kwargs)
        except errors.APIError as exc:
            if "storage_opt" in kwargs and self.disk_limits == "auto" and "storage" in str(exc).lower():
                # The storage driver sets no size (overlay without project quotas): run without the limit.
                log.warning("the engine cannot limit container disk (%s): running without a disk limit",
                            exc.explanation or exc)
                self.disk_limits = "off"
                kwargs = {k: v for k, v in kwargs.items() if k != "storage_opt"}
                return self.client.containers.create(**kwargs)
            raise

    def _pull(self, spec: WorkloadSpec) -> None:
        if "@" in spec.image:  # by digest
            repository, tag = spec.image, None
        elif ":" in spec.image.rsplit("/", 1)[-1]:
            repository, _, tag = spec.image.rpartition(":")
        else:
            repository, tag = spec.image, "latest"
        state(self.report, spec.lease, "pulling", progress=f"pulling {spec.image}")
        last = 0.0
        try:
            for event in self.client.api.pull(repository, tag=tag, stream=True, decode=True):
                if "error" in event:
                    raise self._fail(spec.lease, f"the image {spec.image} could not be pulled: {event['error']}")
                now = time.monotonic()
                if now - last >= 1.0:  # progress at most once a second
                    last = now
                    detail = " ".join(str(event.get(k, "")) for k in ("id", "status", "progress") if event.get(k))
                    state(self.report, spec.lease, "pulling", progress=detail[:300])
        except self._engine_errors as exc:
            raise self._fail(spec.lease, f"the image {spec.image} could not be pulled: {_why(exc)}")

    # --- watching a running container ------------------------------------------------------------------------

    def _adopt(self, container) -> dict[str, Any]:
        lease = container.labels.get(LABEL_LEASE, "")
        status = container.attrs.get("State", {}).get("Status", container.status)
        if status == "running":
            self._watch(lease, container, since=time.time())
            state(self.report, lease, "running", container=container.id,
                  at=_ts(container.attrs.get("State", {}).get("StartedAt")))
            return {"container": container.id, "state": "running"}
        self._report_exit(lease, container)
        return {"container": container.id, "state": "exited"}

    def _watch(self, lease: str, container, since: float | None = None) -> None:
        """Follow its output (from `since`, seconds since the epoch, for an adopted one) and its exit."""
        with self._lock:
            if lease in self._watched:
                return
            self._watched.add(lease)
        threading.Thread(target=self._follow, args=(lease, container, since), name=f"watch-{lease[:8]}",
                         daemon=True).start()

    def _read_output(self, container, since: float | None, pieces: queue.SimpleQueue) -> None:
        """The engine's stream of the container's output, piece by piece, into `pieces`; then None at its end
        (the container exited), or what ended it otherwise."""
        try:
            for piece in container.logs(stream=True, follow=True, stdout=True, stderr=True, since=since):
                pieces.put(piece)
                if self._closed.is_set():
                    break
            pieces.put(None)
        except Exception as exc:  # handed to the watcher, which knows the lease
            pieces.put(exc)

    def _follow(self, lease: str, container, since: float | None) -> None:
        """Send the container's output in chunks, each within LOG_FLUSH_SECONDS of its first byte (output that
        then pauses is not held back), until it exits; then its exit."""
        pieces: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._read_output, args=(container, since, pieces), name=f"logs-{lease[:8]}",
                         daemon=True).start()
        decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a character split across pieces stays whole
        text, due, piece = "", None, b""
        try:
            while True:
                try:
                    piece = pieces.get(timeout=None if due is None else max(0.0, due - time.monotonic()))
                except queue.Empty:
                    piece = b""  # nothing new, and the output held is due
                if self._closed.is_set():
                    return  # the agent stops: a restarted one adopts the container and its output
                if piece is None or isinstance(piece, BaseException):
                    break
                text += decoder.decode(piece)
                if text and due is None:
                    due = time.monotonic() + LOG_FLUSH_SECONDS
                if text and (len(text) >= LOG_CHUNK_BYTES or time.monotonic() >= due):
                    self._send_output(lease, text)
                    text, due = "", None
            self._send_output(lease, text + decoder.decode(b"", final=True))
            if piece is None:
                self._report_exit(lease, container)
            elif not isinstance(piece, self._docker.errors.NotFound):  # NotFound: removed (stop_workload)
                log.error("watching the container of lease %s failed: %s", lease, piece)
        finally:
            with self._lock:
                self._watched.discard(lease)

    def _send_output(self, lease: str, text: str) -> None:
        for chunk in _utf8_chunks(text, LOG_CHUNK_BYTES):
            self.report(protocol.logs(lease=lease, data=chunk))

    def _report_exit(self, lease: str, container) -> None:
        try:
            result = container.wait(timeout=30)
            container.reload()
        except self._docker.errors.NotFound:
            return
        except self._engine_errors:
            log.exception("reading the exit of lease %s failed", lease)
            return
        st = container.attrs.get("State", {})
        code = result.get("StatusCode", st.get("ExitCode"))
        state(self.report, lease, "exited", container=container.id, exit_code=code, at=_ts(st.get("FinishedAt")))

    # --- stop, notice, inventory -------------------------------------------------------------------------------

    def _container(self, lease: str):
        try:
            return self.client.containers.get(container_name(lease))
        except self._docker.errors.NotFound:
            return None

    def _remove_quietly(self, name: str) -> None:
        try:
            self.client.api.remove_container(name, v=True, force=True)
        except self._engine_errors:
            pass

    def stop(self, lease: str, grace_seconds: float) -> dict[str, Any]:
        container = self._container(lease)
        if container is None:
            state(self.report, lease, "removed")
            return {"removed": False, "exit_code": None}
        try:
            if container.status == "running":
                container.stop(timeout=max(0, int(round(grace_seconds))))  # SIGTERM, the grace, SIGKILL
            container.reload()
            code = container.attrs.get("State", {}).get("ExitCode")
            container.remove(v=True, force=True)  # its anonymous volumes with it
        except self._docker.errors.NotFound:
            code = None
        state(self.report, lease, "removed", exit_code=code)
        return {"removed": True, "exit_code": code}

    def notice(self, lease: str, mode: str, deadline: str, kind: str) -> dict[str, Any]:
        container = self._container(lease)
        if container is None:
            return {"delivered": False}
        if mode == "file":
            body = json.dumps({"kind": kind, "deadline": deadline}).encode()
            container.put_archive("/", _tar({NOTICE_PATH.lstrip("/"): (body, 0o644)},
                                            {"run": 0o755, "run/gpumarket": 0o755}))
        else:
            container.kill(signal="SIGTERM")
        return {"delivered": True, "mode": mode}

    def found(self) -> list[dict[str, Any]]:
        out = []
        for listed in listed_containers(self.client, {"name": NAME_PREFIX}):
            name, labels = listed["name"], listed["labels"]
            if not name.startswith(NAME_PREFIX):
                continue
            lease = labels.get(LABEL_LEASE)
            if not lease or name != container_name(lease):
                log.warning("removing %s: a leftover in this agent's namespace without its labels", name)
                self._remove_quietly(name)
                continue
            if labels.get(LABEL_NODE) not in (self.node, None, ""):
                continue  # another node's agent on the same engine
            running = listed["state"] == "running"
            out.append({"lease": lease, "container": listed["id"], "state": "running" if running else "exited"})
            if running:
                container = self._container(lease)
                if container is not None:  # else it went between the listing and now: its watcher is not needed
                    self._watch(lease, container, since=time.time())
        return out

    def close(self) -> None:
        self._closed.set()
        try:
            self.client.close()
        except Exception:
            pass


def listed_containers(client, filters: dict) -> list[dict[str, Any]]:
    """Containers as the engine lists them (id, name, labels, state), without inspecting each one: the SDK's
    `containers.list` inspects every container it listed, and one removed meanwhile fails the whole listing
    (Podman answers that with a 500, which the SDK's `ignore_removed` does not catch)."""
    return [{"id": c["Id"], "name": (c.get("Names") or [""])[0].lstrip("/"), "labels": c.get("Labels") or {},
             "state": c.get("State") or ""}
            for c in client.api.containers(all=True, filters=filters)]


# A container start the engine failed on its side (a 5xx: e.g. Podman's "passing bulk input to subprocess: write
# |1: broken pipe" when its runtime helper dies under load) is tried again after these pauses; a refusal of the
# request itself (a 4xx: bad command, missing image) is not.
START_RETRY_PAUSES = (0.5, 2.0)


def _transient(exc: Exception) -> bool:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status is None or status >= 500
