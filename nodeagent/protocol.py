"""Agent protocol v1: the one contract shared by the node agent and the server's agent gateway.

Every frame is one JSON object with `v` (protocol version) and `type`. `docs/agent-protocol.md` documents
the exchange; this module holds the schemas and validates frames so both sides refuse the same things.
Pure Python: imported by the agent (no Django) and by the server.

agent -> server: hello, metrics, result, event, workload, logs
server -> agent: welcome, command, error

A frame type or a command this side does not know is refused with a clear error (an older agent answers a
newer server's command with `not_supported`; a server refuses an agent frame it does not know with `bad_frame`).
"""
from __future__ import annotations

import json

try:  # a C parser where installed (the server pins it); the standard one otherwise (agents need nothing)
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - exercised on agents without orjson
    _loads = json.loads
import math
import re
from typing import Any

from nodeagent.hardware import gpus as catalog

VERSION = 1

AGENT_TYPES = frozenset({"hello", "metrics", "result", "event", "workload", "logs"})
SERVER_TYPES = frozenset({"welcome", "command", "error"})

# Commands the server may send; each with its required argument names.
COMMANDS: dict[str, tuple[str, ...]] = {
    "create_instance": ("gpu_uuid", "profile", "start"),  # MIG GPU + compute instance with a placement
    "destroy_instance": ("gpu_uuid", "instance_uuid"),
    "set_busy": ("gpu_uuid", "instance_uuid", "busy"),  # simulated load on an instance (demo, tests)
    "notice": ("kind", "deadline", "instance_uuid"),  # e.g. spot interruption notice, forwarded to the host
    "inject_fault": ("gpu_uuid", "fault"),  # simulated backend only: overheat | power | ecc | xid | clear
    "start_workload": ("lease", "spec"),  # run a lease's container on its slice (spec: validate_workload_spec)
    "stop_workload": ("lease", "grace_seconds"),  # SIGTERM, the grace, then kill; the container and its volumes go
    "ping": (),
}

# Workloads (the containers of leases)
WORKLOAD_STATES = ("pulling", "starting", "running", "exited", "failed", "removed")
WORKLOAD_KINDS = ("interactive", "job")
NOTICE_MODES = ("sigterm", "file")  # how a spot interruption notice reaches a container
MAX_LOG_CHUNK_BYTES = 16 * 1024
MAX_IMAGE_CHARS = 300
MAX_ENV = 128
MAX_PORTS = 16
MAX_SSH_KEYS = 16

# Error codes carried by `error` frames and failed `result`s.
E_BAD_FRAME = "bad_frame"
E_VERSION = "unsupported_version"
E_UNAUTHORISED = "unauthorised"
E_FORBIDDEN = "forbidden"
E_RATE_LIMITED = "rate_limited"  # a frame over the server's per-socket rate: dropped
E_REPLACED = "replaced"  # a newer connection now speaks for this node (close 4409)
E_NOT_FOUND = "not_found"
E_INSUFFICIENT = "insufficient_resources"
E_PLACEMENT = "illegal_placement"
E_NOT_SUPPORTED = "not_supported"
E_INTERNAL = "internal"

# Websocket close codes the server ends an agent's socket with.
CLOSE_BAD_FRAME = 4400  # malformed frames (or persistent flooding)
CLOSE_UNAUTHORISED = 4401  # unknown, missing or rotated token, or a deleted node
CLOSE_FORBIDDEN = 4403  # a hello naming another node's GPU
CLOSE_REPLACED = 4409  # a newer connection of the same node took over

MAX_FRAME_BYTES = 1 << 20
MAX_GPUS_PER_NODE = 64
# What the server's columns hold: a value past these would fail the write of a whole batch (every node's
# metrics in one flush), so the frame is refused instead.
MAX_UUID_CHARS = 80
MAX_PROFILE_CHARS = 30
MAX_MEMORY_MIB = 2**31 - 1
MAX_COUNTER = 2**63 - 1
# Driver ("550.54.15") and CUDA ("12.4") versions: the CUDA filter compares them as numbers.
VERSION_TEXT = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6}){0,3}")
MAX_VERSION_CHARS = {"driver_version": 40, "cuda_version": 20}


class ProtocolError(ValueError):
    """A frame that does not follow protocol v1; `code` is one of the E_* codes."""

    def __init__(self, message: str, code: str = E_BAD_FRAME):
        super().__init__(message)
        self.code = code
        self.message = message


def encode(frame: dict) -> str:
    return json.dumps(frame, separators=(",", ":"), allow_nan=False)


def decode(text: str | bytes) -> dict:
    """Parse one frame and check its envelope; raises ProtocolError."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_FRAME_BYTES:
            raise ProtocolError("frame too large")
        text = bytes(text).decode("utf-8", errors="strict")
    elif len(text) > MAX_FRAME_BYTES:
        raise ProtocolError("frame too large")
    try:
        frame = _loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(frame, dict):
        raise ProtocolError("a frame must be a JSON object")
    if frame.get("v") != VERSION:
        raise ProtocolError(f"protocol version {frame.get('v')!r} is not supported; this side speaks v{VERSION}",
                            E_VERSION)
    if not isinstance(frame.get("type"), str):
        raise ProtocolError("frame has no type")
    return frame


# --- builders ---------------------------------------------------------------------------------------

def hello(*, hostname: str, agent_version: str, backend: str, driver_version: str, cuda_version: str,
          gpus: list[dict], runtime: str | None = None, workloads: list[dict] | None = None) -> dict:
    """`runtime`: what runs containers here (none, simulated, docker); `workloads`: the containers of leases
    the agent found at start ({lease, container, state}), for the server to adopt or remove."""
    frame = {"v": VERSION, "type": "hello", "hostname": hostname, "agent_version": agent_version,
             "backend": backend, "driver_version": driver_version, "cuda_version": cuda_version, "gpus": gpus}
    if runtime is not None:
        frame["runtime"] = runtime
    if workloads is not None:
        frame["workloads"] = workloads
    return frame


def welcome(*, node_id: str, metrics_interval: float, heartbeat_timeout: float) -> dict:
    return {"v": VERSION, "type": "welcome", "node_id": node_id, "metrics_interval": metrics_interval,
            "heartbeat_timeout": heartbeat_timeout}


def metrics(*, ts: float, gpus: list[dict]) -> dict:
    return {"v": VERSION, "type": "metrics", "ts": ts, "gpus": gpus}


def command(*, id: str, op: str, args: dict) -> dict:
    return {"v": VERSION, "type": "command", "id": id, "op": op, "args": args}


def result_ok(*, id: str, result: dict) -> dict:
    return {"v": VERSION, "type": "result", "id": id, "ok": True, "result": result}


def result_error(*, id: str, code: str, message: str) -> dict:
    return {"v": VERSION, "type": "result", "id": id, "ok": False, "error": {"code": code, "message": message}}


def event(*, kind: str, gpu_uuid: str | None = None, detail: dict | None = None) -> dict:
    return {"v": VERSION, "type": "event", "kind": kind, "gpu_uuid": gpu_uuid, "detail": detail or {}}


def workload(*, lease: str, state: str, at: float, container: str | None = None, exit_code: int | None = None,
             reason: str = "", progress: str = "") -> dict:
    """A container's state changed (pulling with progress, starting, running, exited with its code, failed with
    the engine's reason, removed)."""
    return {"v": VERSION, "type": "workload", "lease": lease, "state": state, "at": at, "container": container,
            "exit_code": exit_code, "reason": reason, "progress": progress}


def logs(*, lease: str, data: str) -> dict:
    """A chunk of a container's output (stdout and stderr as the engine interleaves them)."""
    return {"v": VERSION, "type": "logs", "lease": lease, "data": data}


def error(*, code: str, message: str, ref: str | None = None) -> dict:
    return {"v": VERSION, "type": "error", "code": code, "message": message, "ref": ref}


# --- validators (server side mostly; the agent validates commands) ----------------------------------

def _req(d: dict, key: str, kind: type | tuple, where: str) -> Any:
    if key not in d:
        raise ProtocolError(f"{where}: missing {key!r}")
    val = d[key]
    if isinstance(val, bool) and kind in (int, float, (int, float)):
        raise ProtocolError(f"{where}: {key!r} must be a number")
    if not isinstance(val, kind):
        raise ProtocolError(f"{where}: {key!r} has the wrong type")
    return val


def _num(d: dict, key: str, where: str, *, lo: float | None = None, hi: float | None = None,
         optional: bool = False) -> float | None:
    if optional and d.get(key) is None:
        return None
    val = _req(d, key, (int, float), where)
    if not math.isfinite(val):
        raise ProtocolError(f"{where}: {key!r} must be finite")
    if (lo is not None and val < lo) or (hi is not None and val > hi):
        raise ProtocolError(f"{where}: {key!r}={val} out of range [{lo}, {hi}]")
    return val


def _str(d: dict, key: str, where: str, *, max_chars: int) -> str:
    val = _req(d, key, str, where)
    if len(val) > max_chars:
        raise ProtocolError(f"{where}: {key!r} is longer than {max_chars} characters")
    return val


def _counter(d: dict, key: str, where: str) -> None:
    val = d.get(key)
    if val is None:
        return
    if isinstance(val, bool) or not isinstance(val, int) or not 0 <= val <= MAX_COUNTER:
        raise ProtocolError(f"{where}: {key!r} must be an integer count in [0, {MAX_COUNTER}]")


def validate_hello(frame: dict) -> dict:
    w = "hello"
    for key in ("hostname", "agent_version", "backend"):
        _req(frame, key, str, w)
    for key, max_chars in MAX_VERSION_CHARS.items():
        val = _req(frame, key, str, w)
        if len(val) > max_chars or not VERSION_TEXT.fullmatch(val):
            raise ProtocolError(f"hello: {key!r} must be a version of digits and dots like 12.4, at most "
                                f"{max_chars} characters (got {val[:40]!r})")
    gpus = _req(frame, "gpus", list, w)
    if len(gpus) > MAX_GPUS_PER_NODE:
        raise ProtocolError(f"hello: more than {MAX_GPUS_PER_NODE} GPUs")
    seen: set[str] = set()
    for i, g in enumerate(gpus):
        gw = f"hello.gpus[{i}]"
        if not isinstance(g, dict):
            raise ProtocolError(f"{gw}: must be an object")
        uuid = _str(g, "uuid", gw, max_chars=MAX_UUID_CHARS)
        if not uuid or uuid in seen:
            raise ProtocolError(f"{gw}: uuid empty or repeated")
        seen.add(uuid)
        _num(g, "index", gw, lo=0, hi=MAX_GPUS_PER_NODE)
        name = _req(g, "name", str, gw)
        memory_mib = _num(g, "memory_mib", gw, lo=0, hi=MAX_MEMORY_MIB)
        _req(g, "mig_enabled", bool, gw)
        if g.get("model") is not None:
            # The model decides what the GPU is sold as: it must be the board the name and memory describe.
            why = catalog.model_disagreement(_req(g, "model", str, gw), name=name, memory_mib=memory_mib)
            if why:
                raise ProtocolError(f"{gw}: {why}")
        mig_geo = g.get("mig")
        if mig_geo is not None:
            if not isinstance(mig_geo, dict):
                raise ProtocolError(f"{gw}.mig: must be an object")
            _num(mig_geo, "memory_slices", gw, lo=1, hi=16)
            _num(mig_geo, "compute_slices", gw, lo=1, hi=16)
            for j, p in enumerate(_req(mig_geo, "profiles", list, gw)):
                pw = f"{gw}.mig.profiles[{j}]"
                if not isinstance(p, dict):
                    raise ProtocolError(f"{pw}: must be an object")
                _req(p, "name", str, pw)
                for key in ("compute_slices", "memory_slices", "max_count"):
                    _num(p, key, pw, lo=0, hi=64)
                _num(p, "memory_gb", pw, lo=0)
                starts = _req(p, "starts", list, pw)
                if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 64 for s in starts):
                    raise ProtocolError(f"{pw}: starts must be small integers")
        for j, inst in enumerate(g.get("instances") or []):
            iw = f"{gw}.instances[{j}]"
            if not isinstance(inst, dict):
                raise ProtocolError(f"{iw}: must be an object")
            _str(inst, "uuid", iw, max_chars=MAX_UUID_CHARS)
            _str(inst, "profile", iw, max_chars=MAX_PROFILE_CHARS)
            _num(inst, "start", iw, lo=0, hi=64)
    if frame.get("runtime") is not None:
        _str(frame, "runtime", w, max_chars=40)
    workloads = frame.get("workloads") or []
    if not isinstance(workloads, list) or len(workloads) > 4 * MAX_GPUS_PER_NODE * 8:
        raise ProtocolError("hello: workloads is a list")
    for j, found in enumerate(workloads):
        ww = f"hello.workloads[{j}]"
        if not isinstance(found, dict):
            raise ProtocolError(f"{ww}: must be an object")
        _lease(found, ww)
        _str(found, "container", ww, max_chars=128)
        if _req(found, "state", str, ww) not in WORKLOAD_STATES:
            raise ProtocolError(f"{ww}: state is one of {', '.join(WORKLOAD_STATES)}")
    return frame


METRIC_FIELDS = ("util", "mem_used_mib", "mem_total_mib", "temp_c", "power_w", "sm_clock_mhz",
                 "ecc_sbe", "ecc_dbe")


# (reading, lowest, highest) of a metrics sample; "unbounded" readings get a finite ceiling here so that
# infinities fall to the explaining checks below.
_READINGS = (("util", 0, 100), ("mem_used_mib", 0, 1e15), ("mem_total_mib", 0, 1e15), ("temp_c", -50, 200),
             ("power_w", 0, 5000), ("sm_clock_mhz", 0, 10000))


def _sample_ok(g) -> bool:
    """True if a metrics sample is plainly valid. It accepts nothing the checks of validate_metrics would
    refuse; False only means "look closer" (those checks then raise with the reason, or accept)."""
    if type(g) is not dict or type(g.get("uuid")) is not str:
        return False
    for key, lo, hi in _READINGS:
        v = g.get(key)
        if v is None:
            continue
        if (type(v) is not float and type(v) is not int) or not lo <= v <= hi:  # NaN fails the range
            return False
    for key in ("ecc_sbe", "ecc_dbe"):
        v = g.get(key)
        if v is not None and (type(v) is not int or not 0 <= v <= MAX_COUNTER):
            return False
    xid = g.get("xid")
    if xid and (type(xid) is not list or any(type(x) is not int for x in xid)):
        return False
    used, total = g.get("mem_used_mib"), g.get("mem_total_mib")
    return used is None or total is None or used <= total


def validate_metrics(frame: dict) -> dict:
    """Check a metrics batch: `gpus` is a list of {uuid, util, mem_used_mib, ..., xid: [codes]}; every
    reading may be null where the GPU cannot report it."""
    w = "metrics"
    _num(frame, "ts", w, lo=0)
    gpus = _req(frame, "gpus", list, w)
    if len(gpus) > MAX_GPUS_PER_NODE:
        raise ProtocolError(f"metrics: more than {MAX_GPUS_PER_NODE} GPUs")
    seen: set[str] = set()
    for i, g in enumerate(gpus):
        if _sample_ok(g):  # the common case, checked without building messages
            if g["uuid"] in seen:
                raise ProtocolError(f"metrics.gpus[{i}]: uuid repeated in one batch")
            seen.add(g["uuid"])
            continue
        gw = f"metrics.gpus[{i}]"
        if not isinstance(g, dict):
            raise ProtocolError(f"{gw}: must be an object")
        uuid = _req(g, "uuid", str, gw)
        if uuid in seen:  # one sample per GPU per batch, or the rollups would count it twice
            raise ProtocolError(f"{gw}: uuid repeated in one batch")
        seen.add(uuid)
        # A reading the GPU cannot give is null, not a made-up number: NVML reports no whole-GPU
        # utilisation in MIG mode, and some boards have no power or ECC counters (NotSupported).
        _num(g, "util", gw, lo=0, hi=100, optional=True)
        used = _num(g, "mem_used_mib", gw, lo=0, optional=True)
        total = _num(g, "mem_total_mib", gw, lo=0, optional=True)
        if used is not None and total is not None and used > total:
            raise ProtocolError(f"{gw}: mem_used_mib={used:g} is more than mem_total_mib={total:g}")
        _num(g, "temp_c", gw, lo=-50, hi=200, optional=True)
        _num(g, "power_w", gw, lo=0, hi=5000, optional=True)
        _num(g, "sm_clock_mhz", gw, lo=0, hi=10000, optional=True)
        _counter(g, "ecc_sbe", gw)
        _counter(g, "ecc_dbe", gw)
        xid = g.get("xid") or []
        if not isinstance(xid, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in xid):
            raise ProtocolError(f"{gw}: xid must be a list of integers")
    return frame


def validate_result(frame: dict) -> dict:
    w = "result"
    _req(frame, "id", str, w)
    ok = _req(frame, "ok", bool, w)
    if ok:
        _req(frame, "result", dict, w)
    else:
        err = _req(frame, "error", dict, w)
        _req(err, "code", str, "result.error")
        _req(err, "message", str, "result.error")
    return frame


def validate_command(frame: dict) -> dict:
    w = "command"
    _req(frame, "id", str, w)
    op = _req(frame, "op", str, w)
    args = _req(frame, "args", dict, w)
    if op not in COMMANDS:
        raise ProtocolError(f"unknown command {op!r}", E_NOT_SUPPORTED)
    for key in COMMANDS[op]:
        if key not in args:
            raise ProtocolError(f"command {op}: missing argument {key!r}")
    if op == "start_workload":
        validate_workload_spec(args["spec"])
    if op == "stop_workload":
        _num(args, "grace_seconds", "stop_workload", lo=0, hi=3600)
    return frame


def validate_event(frame: dict) -> dict:
    _req(frame, "kind", str, "event")
    if frame.get("gpu_uuid") is not None:
        _req(frame, "gpu_uuid", str, "event")
    if frame.get("detail") is not None:
        _req(frame, "detail", dict, "event")
    return frame


def _lease(frame: dict, where: str) -> str:
    lease = _str(frame, "lease", where, max_chars=64)
    if not lease:
        raise ProtocolError(f"{where}: empty lease")
    return lease


def validate_workload(frame: dict) -> dict:
    w = "workload"
    _lease(frame, w)
    if _req(frame, "state", str, w) not in WORKLOAD_STATES:
        raise ProtocolError(f"workload: state is one of {', '.join(WORKLOAD_STATES)}")
    _num(frame, "at", w, lo=0)
    if frame.get("container") is not None:
        _str(frame, "container", w, max_chars=128)
    if frame.get("exit_code") is not None:
        code = frame["exit_code"]
        if isinstance(code, bool) or not isinstance(code, int) or not -(2**31) <= code < 2**31:
            raise ProtocolError("workload: exit_code must be an integer")
    for key in ("reason", "progress"):
        if frame.get(key) is not None:
            _str(frame, key, w, max_chars=2000)
    return frame


def validate_logs(frame: dict) -> dict:
    _lease(frame, "logs")
    data = _req(frame, "data", str, "logs")
    if len(data.encode("utf-8", errors="replace")) > MAX_LOG_CHUNK_BYTES:
        raise ProtocolError(f"logs: a chunk is at most {MAX_LOG_CHUNK_BYTES} bytes")
    return frame


def _str_list(d: dict, key: str, where: str, *, max_items: int, max_chars: int) -> list[str]:
    val = d.get(key) or []
    if not isinstance(val, list) or len(val) > max_items or not all(
            isinstance(x, str) and len(x) <= max_chars for x in val):
        raise ProtocolError(f"{where}: {key!r} is a list of at most {max_items} strings of {max_chars} characters")
    return val


def validate_workload_spec(spec: Any) -> dict:
    """The `spec` of a start_workload command: what to run, where, with what limits and access."""
    w = "start_workload.spec"
    if not isinstance(spec, dict):
        raise ProtocolError(f"{w}: must be an object")
    image = _str(spec, "image", w, max_chars=MAX_IMAGE_CHARS)
    if not image.strip() or any(c.isspace() for c in image):
        raise ProtocolError(f"{w}: image is an image reference without spaces")
    _str_list(spec, "command", w, max_items=64, max_chars=4096)
    _str_list(spec, "args", w, max_items=256, max_chars=4096)
    env = spec.get("env") or {}
    if not isinstance(env, dict) or len(env) > MAX_ENV or not all(
            isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 128 and len(v) <= 32768
            for k, v in env.items()):
        raise ProtocolError(f"{w}: env maps at most {MAX_ENV} names to string values")
    _str_list(spec, "secret_names", w, max_items=MAX_ENV, max_chars=128)  # env values never to print
    ports = spec.get("ports") or []
    if not isinstance(ports, list) or len(ports) > MAX_PORTS:
        raise ProtocolError(f"{w}: ports is a list of at most {MAX_PORTS}")
    for i, port in enumerate(ports):
        pw = f"{w}.ports[{i}]"
        if not isinstance(port, dict):
            raise ProtocolError(f"{pw}: must be an object")
        _num(port, "container_port", pw, lo=1, hi=65535)
        _num(port, "host_port", pw, lo=1, hi=65535)
        if port.get("protocol", "tcp") not in ("tcp", "udp"):
            raise ProtocolError(f"{pw}: protocol is tcp or udp")
    limits = _req(spec, "limits", dict, w)
    _num(limits, "cpus", f"{w}.limits", lo=0.01, hi=1024)
    _num(limits, "memory_mb", f"{w}.limits", lo=16, hi=2**31)
    _num(limits, "disk_gb", f"{w}.limits", lo=0, hi=1_000_000, optional=True)
    device = _req(spec, "device", dict, w)
    _str(device, "gpu_uuid", f"{w}.device", max_chars=MAX_UUID_CHARS)
    _str(device, "instance_uuid", f"{w}.device", max_chars=MAX_UUID_CHARS)
    _str_list(spec, "ssh_keys", w, max_items=MAX_SSH_KEYS, max_chars=16384)
    if spec.get("notice", "sigterm") not in NOTICE_MODES:
        raise ProtocolError(f"{w}: notice is one of {', '.join(NOTICE_MODES)}")
    if spec.get("kind", "interactive") not in WORKLOAD_KINDS:
        raise ProtocolError(f"{w}: kind is one of {', '.join(WORKLOAD_KINDS)}")
    _num(spec, "max_seconds", w, lo=1, optional=True)
    return spec


VALIDATORS = {"hello": validate_hello, "metrics": validate_metrics, "result": validate_result,
              "event": validate_event, "command": validate_command, "workload": validate_workload,
              "logs": validate_logs}


def validate(frame: dict) -> dict:
    fn = VALIDATORS.get(frame["type"])
    if fn is None:
        raise ProtocolError(f"unknown frame type {frame['type']!r}")
    return fn(frame)
