"""Agent protocol v1: the one contract shared by the node agent and the server's agent gateway.

Every frame is one JSON object with `v` (protocol version) and `type`. `docs/agent-protocol.md` documents
the exchange; this module holds the schemas and validates frames so both sides refuse the same things.
Pure Python: imported by the agent (no Django) and by the server.

agent -> server: hello, metrics, result, event
server -> agent: welcome, command, error
"""
from __future__ import annotations

import json

try:  # a C parser where installed (the server pins it); the standard one otherwise (agents need nothing)
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - exercised on agents without orjson
    _loads = json.loads
import math
from typing import Any

VERSION = 1

AGENT_TYPES = frozenset({"hello", "metrics", "result", "event"})
SERVER_TYPES = frozenset({"welcome", "command", "error"})

# Commands the server may send; each with its required argument names.
COMMANDS: dict[str, tuple[str, ...]] = {
    "create_instance": ("gpu_uuid", "profile", "start"),  # MIG GPU + compute instance with a placement
    "destroy_instance": ("gpu_uuid", "instance_uuid"),
    "set_busy": ("gpu_uuid", "instance_uuid", "busy"),  # simulated load on an instance (demo, tests)
    "notice": ("kind", "deadline", "instance_uuid"),  # e.g. spot interruption notice, forwarded to the host
    "inject_fault": ("gpu_uuid", "fault"),  # simulated backend only: overheat | power | ecc | xid | clear
    "ping": (),
}

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
CLOSE_UNAUTHORISED = 4401  # unknown, missing or rotated token
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
          gpus: list[dict]) -> dict:
    return {"v": VERSION, "type": "hello", "hostname": hostname, "agent_version": agent_version,
            "backend": backend, "driver_version": driver_version, "cuda_version": cuda_version, "gpus": gpus}


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
    for key in ("hostname", "agent_version", "backend", "driver_version", "cuda_version"):
        _req(frame, key, str, w)
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
        _req(g, "name", str, gw)
        _num(g, "memory_mib", gw, lo=0, hi=MAX_MEMORY_MIB)
        _req(g, "mig_enabled", bool, gw)
        if g.get("model") is not None:
            _req(g, "model", str, gw)
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
    return True


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
        _num(g, "mem_used_mib", gw, lo=0, optional=True)
        _num(g, "mem_total_mib", gw, lo=0, optional=True)
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
    return frame


def validate_event(frame: dict) -> dict:
    _req(frame, "kind", str, "event")
    if frame.get("gpu_uuid") is not None:
        _req(frame, "gpu_uuid", str, "event")
    if frame.get("detail") is not None:
        _req(frame, "detail", dict, "event")
    return frame


VALIDATORS = {"hello": validate_hello, "metrics": validate_metrics, "result": validate_result,
              "event": validate_event, "command": validate_command}


def validate(frame: dict) -> dict:
    fn = VALIDATORS.get(frame["type"])
    if fn is None:
        raise ProtocolError(f"unknown frame type {frame['type']!r}")
    return fn(frame)
