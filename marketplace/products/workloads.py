"""Workloads as buyers ask for them: the spec an order carries (an operator's template, or any image a provider
allows, with command, arguments, environment, ports, disk and kind), checked once here for the API and the console,
and the SSH public keys buyers keep on their account. Running them is the lifecycle's (lifecycle/workloads.py).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction

from marketplace.lifecycle.workloads import new_jupyter_token
from marketplace.models import SshKey, Template
from nodeagent.protocol import MAX_SSH_KEYS
from scheduler.errors import Conflict, DomainError, NotFound

IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:@]{0,299}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV = {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}  # the agent sets them to the lease's device
PORT_KINDS = ("ssh", "http", "tcp")
KINDS = ("interactive", "job")
NOTICES = ("sigterm", "file")
# The workload's limits, once (the API's serializer and the console's form read them too).
WORKLOAD_BOUNDS = {"env": 128, "ports": 16, "command": 64, "args": 256, "disk_gb": (1, 10000)}
SSH_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                 "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")


@dataclass
class WorkloadSpec:
    """What a buyer asks to run (fields left empty take the template's)."""

    template: str | None = None
    image: str = ""
    command: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    env: list[dict] = field(default_factory=list)  # [{"name", "value", "secret"?}]
    ports: list[dict] = field(default_factory=list)  # [{"port", "protocol"?, "kind"?}]
    disk_gb: int | None = None
    kind: str | None = None
    notice: str = "sigterm"


def _err(message: str, field_name: str) -> DomainError:
    return DomainError(message, field=f"workload.{field_name}")


def workload_resolve(spec: WorkloadSpec) -> dict:
    """The workload `spec` asks for, with its template's defaults, every field checked; DomainError naming the
    field otherwise (`workload.image`, `workload.env`, ...)."""
    template = None
    if spec.template:
        template = Template.objects.filter(key=spec.template, enabled=True).first()
        if template is None:
            raise _err(f"no template {spec.template!r}; see GET /api/v1/templates/", "template")
    image = spec.image or (template.image if template else "")
    if not image:
        raise _err("a workload needs an image (or a template)", "image")
    if not IMAGE.match(image):
        raise _err(f"{image!r} is not an image reference (like docker.io/library/ubuntu:24.04)", "image")
    command = list(spec.command) or (list(template.command) if template else [])
    args = list(spec.args) or (list(template.args) if template else [])
    for name in ("command", "args"):
        items = command if name == "command" else args
        if len(items) > WORKLOAD_BOUNDS[name] or not all(isinstance(x, str) and len(x) <= 4096 for x in items):
            raise _err(f"{name} is a list of at most {WORKLOAD_BOUNDS[name]} strings", name)
    env = {k: {"name": k, "value": str(v), "secret": False} for k, v in (template.env if template else {}).items()}
    for e in spec.env:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not isinstance(e.get("value", ""), str):
            raise _err("each variable is {name, value, secret}", "env")
        if not ENV_NAME.match(e["name"]):
            raise _err(f"{e['name']!r} is not a variable name", "env")
        if e["name"] in RESERVED_ENV:
            raise _err(f"{e['name']} is set to the lease's device by the agent", "env")
        if len(e.get("value", "")) > 32768:
            raise _err(f"the value of {e['name']} is longer than 32 KiB", "env")
        env[e["name"]] = {"name": e["name"], "value": e.get("value", ""), "secret": bool(e.get("secret"))}
    if len(env) > WORKLOAD_BOUNDS["env"]:
        raise _err(f"at most {WORKLOAD_BOUNDS['env']} variables", "env")
    ports = _ports(list(spec.ports) or (list(template.ports) if template else []))
    low, high = WORKLOAD_BOUNDS["disk_gb"]
    disk = spec.disk_gb if spec.disk_gb is not None else (template.disk_gb if template else 20)
    if isinstance(disk, bool) or not isinstance(disk, int) or not low <= disk <= high:
        raise _err(f"disk_gb is between {low} and {high}", "disk_gb")
    kind = spec.kind or (template.kind if template else "interactive")
    if kind not in KINDS:
        raise _err(f"kind is one of {', '.join(KINDS)}", "kind")
    if spec.notice not in NOTICES:
        raise _err(f"notice is one of {', '.join(NOTICES)}", "notice")
    return {"template": template, "image": image, "command": command, "args": args, "env": list(env.values()),
            "ports": ports, "disk_gb": disk, "kind": kind, "notice": spec.notice,
            "jupyter_token": new_jupyter_token() if template is not None and template.jupyter else ""}


def _ports(ports: list) -> list[dict]:
    if len(ports) > WORKLOAD_BOUNDS["ports"]:
        raise _err(f"at most {WORKLOAD_BOUNDS['ports']} ports", "ports")
    out, seen = [], set()
    for p in ports:
        if isinstance(p, (int, str)):  # "22/tcp" or 8888
            text = str(p)
            number, _, proto = text.partition("/")
            p = {"port": number, "protocol": proto or "tcp"}
        if not isinstance(p, dict):
            raise _err("a port is {port, protocol, kind} or \"8888/tcp\"", "ports")
        try:
            number = int(p.get("port"))
        except (TypeError, ValueError):
            raise _err(f"{p.get('port')!r} is not a port number", "ports") from None
        proto = p.get("protocol") or "tcp"
        kind = p.get("kind") or ("ssh" if number == 22 and proto == "tcp" else "tcp")
        if not 1 <= number <= 65535 or proto not in ("tcp", "udp") or kind not in PORT_KINDS:
            raise _err("a port is 1-65535, protocol tcp or udp, kind ssh, http or tcp", "ports")
        if (number, proto) in seen:
            raise _err(f"port {number}/{proto} is given twice", "ports")
        seen.add((number, proto))
        out.append({"port": number, "protocol": proto, "kind": kind})
    return out


def template_list():
    return Template.objects.filter(enabled=True)


# --- SSH keys ---------------------------------------------------------------------------------------------------

def ssh_fingerprint(public_key: str) -> str:
    """"SHA256:..." as `ssh-keygen -l` prints it; DomainError when it is not an OpenSSH public key line."""
    parts = (public_key or "").strip().split()
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        raise DomainError(f"an SSH public key is one line: TYPE BASE64 [comment], TYPE one of "
                          f"{', '.join(SSH_KEY_TYPES[:3])}, ... (the contents of ~/.ssh/id_ed25519.pub)",
                          field="public_key")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise DomainError("the key's second part is not base64", field="public_key") from None
    # The blob starts with the key type, length-prefixed: a copy-paste cut in the middle fails here.
    if len(blob) < 4 or blob[4:4 + int.from_bytes(blob[:4], "big")].decode(errors="replace") != parts[0]:
        raise DomainError("the key's data does not match its type (was it copied whole?)", field="public_key")
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def ssh_key_add(*, user, name: str, public_key: str) -> SshKey:
    """Add a key to the user's account (a key given twice is a Conflict)."""
    name = (name or "").strip()
    if not name or len(name) > 80:
        raise DomainError("a key needs a name of 1 to 80 characters", field="name")
    line = " ".join((public_key or "").strip().split())
    if len(line) > 16384 or "\n" in (public_key or "").strip():
        raise DomainError("an SSH public key is one line", field="public_key")
    fingerprint = ssh_fingerprint(line)
    if SshKey.objects.filter(user=user).count() >= MAX_SSH_KEYS:
        raise Conflict(f"an account keeps at most {MAX_SSH_KEYS} SSH keys: delete one first", code="too_many_keys")
    try:
        with transaction.atomic():
            return SshKey.objects.create(user=user, name=name, public_key=line, fingerprint=fingerprint)
    except IntegrityError:
        raise Conflict("this key is on your account already", field="public_key") from None


def ssh_key_delete(*, user, key_id) -> None:
    deleted, _ = SshKey.objects.filter(user=user, pk=key_id).delete()
    if not deleted:
        raise NotFound("no such key among yours")
