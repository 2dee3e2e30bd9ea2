"""Command-line values into API values, without a server: durations, times, prices, environment variables, ports,
offer IDs, and the order body built from `gpum order`'s flags. Each raises argparse.ArgumentTypeError (a usage
error, exit 2) with the reason."""
from __future__ import annotations

import argparse
import os
import re
import shlex
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
PORT_SUFFIXES = {"tcp": {"protocol": "tcp"}, "udp": {"protocol": "udp"}, "http": {"protocol": "tcp", "kind": "http"},
                 "ssh": {"protocol": "tcp", "kind": "ssh"}}
MONTH = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")
PROFILE = re.compile(r"^(\d+)g\.(\d+)gb(\+me)?$")

Bad = argparse.ArgumentTypeError


def duration(text: str) -> int:
    """Seconds from 90, 90s, 30m, 2h, 1h30m, 1.5h, 1d."""
    t = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+", t):
        seconds = float(t)
    elif t and DURATION_PART.sub("", t) == "":
        seconds = sum(float(n) * UNITS[u] for n, u in DURATION_PART.findall(t))
    else:
        raise Bad(f"{text!r} is not a duration (e.g. 90s, 30m, 2h, 1h30m, 1d, or seconds)")
    if seconds < 1 or seconds != int(seconds):
        raise Bad(f"{text!r}: a duration is a whole number of seconds, at least 1")
    return int(seconds)


def when(text: str, *, now: datetime | None = None) -> datetime:
    """A moment: ISO 8601 (2026-12-01T10:00, with Z or an offset; without one it is local time), or +DURATION from
    now (+2h). Returned in UTC."""
    now = now or datetime.now(timezone.utc)
    t = text.strip()
    if t.startswith("+"):
        return (now + timedelta(seconds=duration(t[1:]))).astimezone(timezone.utc).replace(microsecond=0)
    try:
        moment = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise Bad(f"{text!r} is not a time: use ISO 8601 (2026-12-01T10:00Z, local time without a zone) "
                  "or +DURATION from now (+2h)") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # the user's local time, as a terminal user means it
    return moment.astimezone(timezone.utc)


def hours(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise Bad(f"{text!r} is not a number of hours") from None
    if not value.is_finite() or value <= 0:
        raise Bad(f"hours must be more than 0, not {text}")
    return value


def price(text: str) -> str:
    """A price in USD (per hour for caps and bids): a decimal with at most 6 places, kept as text for the API."""
    t = text.strip().lstrip("$")
    try:
        value = Decimal(t)
    except InvalidOperation:
        raise Bad(f"{text!r} is not an amount in USD (e.g. 1.20)") from None
    if not value.is_finite() or value < 0:
        raise Bad(f"an amount cannot be negative or infinite: {text}")
    if value != value.quantize(Decimal("0.000001")):
        raise Bad(f"{text}: at most 6 decimal places (micro-dollars)")
    return t


def month(text: str) -> str:
    if not MONTH.match(text.strip()):
        raise Bad(f"{text!r} is not a month: YYYY-MM, e.g. 2026-11")
    return text.strip()


def env_pair(text: str) -> tuple[str, str]:
    """NAME=VALUE."""
    name, sep, value = text.partition("=")
    if not sep:
        raise Bad(f"{text!r}: give NAME=VALUE")
    return _env_name(name), value


def secret_pair(text: str) -> tuple[str, str]:
    """NAME=VALUE, or NAME alone to take the value from this shell's environment (so that it is not on a command
    line other users of the machine can read)."""
    name, sep, value = text.partition("=")
    name = _env_name(name)
    if sep:
        return name, value
    if name not in os.environ:
        raise Bad(f"--secret-env {name}: ${name} is not set here (export it, or give {name}=VALUE)")
    return name, os.environ[name]


def _env_name(name: str) -> str:
    if not ENV_NAME.match(name):
        raise Bad(f"{name!r} is not a variable name (letters, digits and _, not starting with a digit)")
    return name


def port(text: str) -> dict:
    """PORT[/tcp|/udp|/http|/ssh]: 22 (tcp; shown as an ssh command), 8888/http (a URL), 9000/udp."""
    number, _, suffix = text.strip().lower().partition("/")
    if not number.isdigit() or not 1 <= int(number) <= 65535:
        raise Bad(f"{text!r}: a port is 1 to 65535, optionally /tcp, /udp, /http or /ssh (e.g. 22, 8888/http)")
    if suffix and suffix not in PORT_SUFFIXES:
        raise Bad(f"{text!r}: after the port comes /tcp, /udp, /http or /ssh")
    return {"port": int(number), **PORT_SUFFIXES.get(suffix, {"protocol": "tcp"})}


def words(text: str) -> list[str]:
    """A command as a shell would split it: "python train.py --epochs 3"."""
    try:
        out = shlex.split(text)
    except ValueError as exc:
        raise Bad(f"{text!r}: {exc}") from None
    if not out:
        raise Bad("an empty command")
    return out


def offer(text: str) -> dict:
    """An offer ID as `gpum offers` lists it (MODEL:PROFILE:REGION) as order constraints: that model, in that
    region, a slice of that profile's memory and compute slices (or a whole GPU)."""
    parts = text.strip().split(":")
    if len(parts) != 3 or not all(parts):
        raise Bad(f"{text!r} is not an offer ID: MODEL:PROFILE:REGION, as `gpum offers` lists them "
                  "(e.g. h100-80gb:3g.40gb:eu-west)")
    model, profile, region = parts
    out: dict = {"gpu_models": [model], "regions": [region]}
    if profile == "whole":
        out["whole_gpu"] = True
        return out
    m = PROFILE.match(profile)
    if not m:
        raise Bad(f"{text!r}: {profile!r} is not a slice profile (like 3g.40gb) or whole")
    out.update(compute_slices=int(m[1]), memory_gb=int(m[2]), whole_gpu=False)
    return out


# --- the order body ------------------------------------------------------------------------------------------------

# The API's field -> the flag that sets it: an error about a field is shown with the flag the user typed.
FLAG_FOR_FIELD = {
    "gpu_models": "--model", "memory_gb": "--memory", "compute_slices": "--compute-slices",
    "whole_gpu": "--whole-gpu", "gpu_count": "--gpus", "min_cuda": "--min-cuda",
    "min_compute_capability": "--min-compute-capability", "regions": "--region", "buyer_region": "--buyer-region",
    "duration_seconds": "--duration", "window_start": "--start", "window_end": "--hours/--end",
    "max_price_per_hour": "--max-price (--bid for spot)", "priority": "--priority", "if_unavailable": "--queue",
    "webhook_url": "--webhook", "project": "--project", "workload.template": "--template",
    "workload.image": "--image", "workload.command": "--cmd", "workload.args": "--args",
    "workload.env": "--env/--secret-env", "workload.ports": "--port", "workload.disk_gb": "--disk",
    "workload.kind": "--job", "workload.notice": "--notice",
}

WORKLOAD_FLAGS = ("template", "image", "cmd", "args", "env", "secret_env", "ports", "disk", "job", "notice")


def workload(ns: argparse.Namespace) -> dict | None:
    """The order's workload from its flags, or None when none was given (the lease holds its slice only)."""
    if not any(getattr(ns, f, None) not in (None, False, []) for f in WORKLOAD_FLAGS):
        return None
    w: dict = {}
    if ns.template:
        w["template"] = ns.template
    if ns.image:
        w["image"] = ns.image
    if ns.cmd:
        w["command"] = ns.cmd
    if ns.args:
        w["args"] = ns.args
    env = [{"name": n, "value": v} for n, v in ns.env or []]
    env += [{"name": n, "value": v, "secret": True} for n, v in ns.secret_env or []]
    names = [e["name"] for e in env]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise Bad(f"{', '.join(twice)} given twice (--env/--secret-env)")
    if env:
        w["env"] = env
    if ns.ports:
        w["ports"] = ns.ports
    if ns.disk is not None:
        w["disk_gb"] = ns.disk
    if ns.job:
        w["kind"] = "job"
    if getattr(ns, "notice", None):
        w["notice"] = ns.notice
    if not w.get("template") and not w.get("image"):
        raise Bad("a workload needs --image or --template (see `gpum templates`)")
    return w


def order_body(ns: argparse.Namespace, mode: str, *, now: datetime | None = None) -> dict:
    """POST /api/v1/orders/'s body from `gpum order MODE`'s flags (docs/api.md, Order body)."""
    body: dict = {"mode": mode}
    if ns.offer:
        body.update(ns.offer)
    if ns.model:
        body["gpu_models"] = ns.model
    if ns.region:
        body["regions"] = ns.region
    for flag, field in (("memory", "memory_gb"), ("compute_slices", "compute_slices"), ("min_cuda", "min_cuda"),
                        ("min_compute_capability", "min_compute_capability"), ("buyer_region", "buyer_region"),
                        ("priority", "priority"), ("webhook", "webhook_url"), ("project", "project")):
        value = getattr(ns, flag, None)
        if value is not None:
            body[field] = value
    if ns.whole_gpu:
        body["whole_gpu"] = True
    gpus = getattr(ns, "gpus", None)
    if gpus is not None:
        body["gpu_count"] = gpus
        if gpus > 1:
            body["whole_gpu"] = True  # k GPUs are k whole GPUs (the API refuses a slice order with a count)
    if ns.queue:
        body["if_unavailable"] = "queue"
    if mode == "spot":
        body["max_price_per_hour"] = ns.bid
    elif ns.max_price is not None:
        body["max_price_per_hour"] = ns.max_price
    if mode == "reserved":
        body["window_start"], body["window_end"] = window(ns.start, hours=ns.hours, end=ns.end)
    elif ns.duration is not None:
        body["duration_seconds"] = ns.duration
    w = workload(ns)
    if w is not None:
        body["workload"] = w
    return body


def window(start: datetime, *, hours: Decimal | None, end: datetime | None) -> tuple[str, str]:
    """A window from --start and --hours or --end, as the API's two ISO times."""
    if end is not None and hours is not None:
        raise Bad("give --hours or --end, not both")
    if end is None and hours is None:
        raise Bad("a window needs --hours (or --end)")
    if end is None:
        end = start + timedelta(seconds=float(hours * 3600))
    return iso(start), iso(end)


def iso(moment: datetime) -> str:
    """A moment as the API reads it: ISO 8601 in UTC with a Z."""
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def flat_fields(fields, path: str = "") -> list[tuple[str, str]]:
    """An error's `fields` (nested as the API nests a workload's) as (workload.env[1].name, message) pairs."""
    if isinstance(fields, dict):
        return [pair for k, v in fields.items() for pair in flat_fields(v, f"{path}.{k}" if path else str(k))]
    if isinstance(fields, list):
        if all(isinstance(v, str) for v in fields):
            return [(path, " ".join(fields))] if fields else []
        return [pair for i, v in enumerate(fields) for pair in flat_fields(v, f"{path}[{i}]")]
    return [(path, str(fields))]


def field_flag(field: str) -> str | None:
    """The flag behind an API field named in an error (`workload.env[2].value` -> --env/--secret-env)."""
    base = re.sub(r"\[\d+\].*$", "", field)
    base = re.sub(r"^(workload\.[a-z_]+).*$", r"\1", base)
    return FLAG_FOR_FIELD.get(base)
