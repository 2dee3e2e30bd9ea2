"""Commands of leases: leases, lease show / end, ssh, logs, metrics."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

from . import config
from .context import Context, command, confirm
from .errors import AuthError, CliError, UsageError
from .resolve import resolve
from .table import Column, duration, local_time, pairs, relative, render, short_id, usd
from .watch import LeaseWatch, new_output

OPEN_STATES = ("provisioning", "running", "interrupting", "ending")
RUNNING = ("running", "interrupting")
DEFAULT_LIMIT = 100
METRICS_TIMEOUT = 30.0


def register(sub, parent) -> None:
    p = command(sub, "leases", parent, "your leases: open ones (--all: every one, newest first)")
    _list_flags(p)

    p = command(sub, "lease", parent, "one lease: show it, end it (or list them)")
    ls = p.add_subparsers(title="lease commands", metavar="ACTION", required=True)
    s = command(ls, "list", parent, "your leases (as gpum leases)", aliases=["ls"])
    _list_flags(s)
    _on_lease(ls, "show", parent, lease_show, "a lease: its state, cost, container and how to reach it",
              epilog="example:\n  gpum lease show 1a2b")
    s = _on_lease(ls, "end", parent, lease_end, "end a lease now: billing stops, its container is stopped and removed",
                  epilog="example:\n  gpum lease end 1a2b --yes")
    s.add_argument("-y", "--yes", action="store_true", help="do not ask")

    p = _on_lease(sub, "ssh", parent, ssh, "ssh into a lease's container (its ssh port, your account's SSH key)",
                  description="Run ssh with the lease's connection line (ssh -p PORT root@HOST). Each lease's host key "
                              "is trusted on first use and kept apart (a host port is reused by later leases), in "
                              "~/.config/gpumarket/known_hosts. Anything after -- goes to ssh: options, then a remote "
                              "command.",
                  epilog="examples:\n  gpum ssh 1a2b\n  gpum ssh 1a2b -i ~/.ssh/work_ed25519 -- nvidia-smi\n"
                         "  gpum ssh 1a2b -- -L 8888:localhost:8888\n"
                         "  gpum ssh 1a2b --print      (the command, not run)")
    p.add_argument("-i", dest="identity", metavar="KEY_FILE", help="the private key to use (ssh -i)")
    p.add_argument("--print", action="store_true", help="print the ssh command line instead of running it")
    p.usage = "gpum ssh [-h] [--json] [-i KEY_FILE] [--print] LEASE [-- SSH_ARGS...]"
    p.set_defaults(takes_passthrough=True)

    p = _on_lease(sub, "logs", parent, logs,
                  "a lease container's output: the kept tail (last 64 KiB); -f follows it live",
                  epilog="examples:\n  gpum logs 1a2b\n  gpum logs 1a2b -f     (until the lease ends, or Ctrl-C)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the lease ends")

    p = _on_lease(sub, "metrics", parent, metrics,
                  "a lease GPU's live metrics: utilisation, memory, temperature, power",
                  description="The lease's GPU readings as the node's agent sends them (about every second): the next "
                              "reading, -n of them, or -f until the lease ends. --json prints each frame of the live "
                              "socket as one line.",
                  epilog="examples:\n  gpum metrics 1a2b\n  gpum metrics 1a2b -f\n  gpum metrics 1a2b -n 5 --json")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing readings until the lease ends")
    p.add_argument("-n", "--count", type=int, default=1, metavar="N", help="print N readings, then stop (default 1)")


def _on_lease(sub, name: str, parent, run, help: str, **kw):
    """A command on one lease: its ID (or a unique prefix) first."""
    p = command(sub, name, parent, help, **kw)
    p.add_argument("lease", help="the lease's ID (or a unique prefix, as gpum leases shows)")
    p.set_defaults(run=run)
    return p


def _list_flags(p) -> None:
    p.add_argument("--all", action="store_true", help="ended and failed leases too")
    p.add_argument("--mode", choices=["on-demand", "spot", "reserved", "resale"], help="only this mode")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, metavar="N",
                   help=f"with --all, the newest N (default {DEFAULT_LIMIT})")
    p.set_defaults(run=leases_list)


def lease_ids_resolver(ctx: Context):
    return lambda: [x["id"] for x in ctx.client.pages("leases/")]


def lease_get(ctx: Context, prefix: str) -> dict:
    lid = resolve(prefix, lease_ids_resolver(ctx), what="lease")
    return ctx.client.get(f"leases/{lid}/")


def gpu_of(lease: dict) -> str:
    return f"{lease.get('gpu_model') or '?'} {lease.get('profile') or 'whole'}"


# --- list and show -------------------------------------------------------------------------------------------------

def leases_list(ctx: Context) -> int:
    a = ctx.args
    mode = a.mode.replace("-", "_") if a.mode else None
    if a.all:
        found = ctx.client.all_pages("leases/", {"mode": mode}, limit=a.limit)
    else:  # one filtered query per open state: a long history of jobs is not read to find the few open
        found = [x for state in OPEN_STATES for x in ctx.client.pages("leases/", {"state": state, "mode": mode})]
        found.sort(key=lambda x: x["created_at"], reverse=True)
    now = datetime.now(timezone.utc)

    def row(x: dict) -> list:
        over = x["state"] in ("ended", "failed")
        return [short_id(x["id"]), x["mode"].replace("_", "-"), x["state"], gpu_of(x), x["region"], _rate(x),
                usd(x["cost"]), relative(x["started_at"], now), relative(x["ended_at"] if over else x["ends_at"], now),
                x.get("end_reason") if over else _container_note(x)]

    ctx.listing(found, [Column("ID"), Column("MODE"), Column("STATE"), Column("GPU", shrink=True),
                        Column("REGION", drop=4), Column("$/H", right=True), Column("COST", right=True),
                        Column("STARTED", drop=2), Column("END", drop=3), Column("NOTE", shrink=True, drop=1)],
                row, empty="no leases" if a.all else "no open leases (--all shows ended ones)")
    if a.all and len(found) == a.limit:
        ctx.note(f"(the newest {a.limit}: --limit N shows more)")
    return 0


def _container_note(lease: dict) -> str:
    """What an open lease's table row adds to its state: an interruption's deadline, or its container's state while
    that is not simply running."""
    i, w = lease.get("interruption") or {}, lease.get("workload") or {}
    if i:
        return f"{i['kind']}: ends {relative(i['deadline'])}"
    if not w or w.get("state") == "running":
        return ""
    progress = f" {w['progress']}" if w.get("progress") not in (None, "") else ""
    return f"container {w.get('state')}{progress}"


def _rate(lease: dict) -> str:
    if lease["mode"] in ("reserved", "resale"):
        return "prepaid"
    return usd(lease["price_per_hour"], places=4).lstrip("$")


def facts_block(lease: dict) -> list[tuple[str, object]]:
    """How to reach a lease, as key/value pairs: ssh line, URLs, ports, the device and its node."""
    c = lease.get("connection") or {}
    out: list[tuple[str, object]] = []
    if c.get("ssh"):
        out.append(("ssh", f"{c['ssh']}    (gpum ssh {short_id(lease['id'])})"))
    for url in c.get("urls") or []:
        out.append(("url", url))
    for p in c.get("ports") or []:
        if p.get("kind") not in ("ssh", "http"):
            out.append(("port", f"{p['container_port']}/{p['protocol']} -> {c.get('address')}:{p['host_port']}"))
    out += [("device", c.get("device_uuid")),
            ("CUDA_VISIBLE_DEVICES", (c.get("env") or {}).get("CUDA_VISIBLE_DEVICES")), ("node", c.get("hostname"))]
    return out


def print_lease_facts(ctx: Context, lease: dict) -> None:
    ctx.print(f"lease {short_id(lease['id'])} {lease['state']}: {gpu_of(lease)} in {lease['region']}, "
              f"{'prepaid' if _rate(lease) == 'prepaid' else usd(lease['price_per_hour'], per_hour=True)}")
    ctx.print(pairs(facts_block(lease)))


def lease_show(ctx: Context) -> int:
    lease = lease_get(ctx, ctx.args.lease)
    if ctx.json:
        ctx.emit(lease)
        return 0
    w = lease.get("workload") or {}
    i = lease.get("interruption") or {}
    over = lease["state"] in ("ended", "failed")
    container = None
    if w:
        container = w.get("state") or "?"
        if w.get("progress") not in (None, "") and w.get("state") in ("pulling", "starting"):
            container += f" {w['progress']}"
        if w.get("exit_code") is not None:
            container += f", exit code {w['exit_code']}"
        if w.get("seconds") is not None:
            container += f", ran {duration(w['seconds'])}"
        if w.get("error"):
            container += f": {w['error']}"
    items = [
        ("id", lease["id"]), ("order", lease.get("order")), ("mode", lease["mode"].replace("_", "-")),
        ("state", lease["state"] + (f" ({lease['end_reason']})" if lease.get("end_reason") else "")),
        ("gpu", f"{gpu_of(lease)} in {lease['region']}"),
        ("price", "prepaid (reserved)" if _rate(lease) == "prepaid" else usd(lease["price_per_hour"], per_hour=True)),
        ("bid", usd(lease["bid_per_hour"], per_hour=True) if lease.get("bid_per_hour") else None),
        ("cost", f"{usd(lease['cost'])} (charged {usd(lease['cost_charged'])})"),
        ("started", f"{local_time(lease['started_at'])} ({relative(lease['started_at'])})"
         if lease.get("started_at") else None),
        ("ends", f"{local_time(lease['ends_at'])} ({relative(lease['ends_at'])})"
         if lease.get("ends_at") and not over else None),
        ("ended", f"{local_time(lease['ended_at'])} ({relative(lease['ended_at'])})"
         if lease.get("ended_at") else None),
        ("container", container),
        ("interruption", f"{i['kind']}, deadline {local_time(i['deadline'])} ({relative(i['deadline'])})"
         if i else None),
    ]
    ctx.print(pairs(items + facts_block(lease)))
    return 0


def lease_end(ctx: Context) -> int:
    lease = lease_get(ctx, ctx.args.lease)
    sid = short_id(lease["id"])
    if lease["state"] not in OPEN_STATES:
        raise CliError(f"lease {sid} is already {lease['state']}")
    confirm(ctx, f"End lease {sid} ({gpu_of(lease)}, {lease['state']}, {usd(lease['cost'])} so far)?")
    lease = ctx.client.post(f"leases/{lease['id']}/end/")
    return ctx.result(lease, f"lease {sid} {lease['state']}: billing stopped; it cost {usd(lease['cost'])}")


# --- ssh -----------------------------------------------------------------------------------------------------------

def known_hosts(env: dict) -> Path:
    return config.config_dir(env) / "known_hosts"


def ssh_argv(ssh_line: str, lease_id: str, *, known_hosts_file: Path, identity: str | None = None,
             extra: list[str] | tuple = ()) -> list[str]:
    """The ssh command for a lease's `ssh -p PORT USER@HOST` line: its host key trusted on first use under an
    alias of the lease (the next lease on that host port has another key), `-i` with only that key offered, then
    the caller's arguments."""
    words = shlex.split(ssh_line)
    if len(words) < 2 or words[0] != "ssh":
        raise CliError(f"the lease's ssh line is not an ssh command: {ssh_line!r}")
    port, dest = None, words[-1]
    if "-p" in words[:-1]:
        port = words[words.index("-p") + 1]
    argv = ["ssh"]
    if port:
        argv += ["-p", port]
    if identity:
        argv += ["-i", os.path.expanduser(identity), "-o", "IdentitiesOnly=yes"]
    argv += ["-o", f"HostKeyAlias=gpum-{lease_id}", "-o", f"UserKnownHostsFile={known_hosts_file}",
             "-o", "StrictHostKeyChecking=accept-new", dest, *extra]
    return argv


def ssh(ctx: Context) -> int:
    a = ctx.args
    lease = lease_get(ctx, a.lease)
    sid = short_id(lease["id"])
    if lease["state"] not in RUNNING:
        raise CliError(f"lease {sid} is {lease['state']}: ssh reaches a running lease",
                       hint=f"wait for it (gpum lease show {sid})" if lease["state"] == "provisioning" else "")
    line = (lease.get("connection") or {}).get("ssh")
    if not line:
        raise CliError(f"lease {sid} has no ssh port",
                       hint="order with --port 22 and an image that runs sshd (e.g. an ssh template: gpum templates)")
    path = known_hosts(ctx.env)
    argv = ssh_argv(line, lease["id"], known_hosts_file=path, identity=a.identity, extra=a.extra)
    if a.print:
        ctx.print(shlex.join(argv))
        return 0
    if shutil.which("ssh") is None:
        raise CliError("ssh is not installed here (OpenSSH client)", hint=f"the command would be: {shlex.join(argv)}")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    ctx.out.flush()
    os.execvp("ssh", argv)
    return 0  # pragma: no cover (exec does not return)


# --- logs and metrics ----------------------------------------------------------------------------------------------

def _key(ctx: Context) -> str:
    key = ctx.settings.key
    if not key:
        raise AuthError("not logged in", hint="run `gpum login` (or set GPUM_API_KEY)")
    return key


def logs(ctx: Context) -> int:
    lid = resolve(ctx.args.lease, lease_ids_resolver(ctx), what="lease")
    if not ctx.args.follow:
        tail = ctx.client.get(f"leases/{lid}/logs/")
        ctx.out.write(tail)
        ctx.out.flush()
        if not tail:
            ctx.note(f"(no output kept for lease {short_id(lid)})")
        return 0
    with LeaseWatch(ctx.client.base_url, _key(ctx), lid) as watch:
        # Subscribed first, then the tail: nothing falls between them; what came twice is dropped (new_output).
        tail = ctx.client.get(f"leases/{lid}/logs/")
        ctx.out.write(tail)
        if not watch.subscribed:  # the lease is over (or not open yet to watchers): its tail is all there is
            ctx.out.flush()
            return 0
        early = watch.early + watch.pending()
        chunks = [f["data"] for f in early if f.get("type") == "lease_log" and f.get("lease") == lid]
        for chunk in new_output(tail, chunks):
            ctx.out.write(chunk)
        ctx.out.flush()
        if any(watch.is_over(f) for f in early):
            return 0
        while True:
            frame = watch.next(None)
            if frame.get("type") == "lease_log" and frame.get("lease") == lid:
                ctx.out.write(frame["data"])
                ctx.out.flush()
            elif watch.is_over(frame):
                return 0


# Fixed widths: readings are printed as they come, each under the one header.
METRIC_COLUMNS = [Column("TIME", width=8), Column("UTIL %", right=True, width=6),
                  Column("MEM USED", right=True, width=10), Column("MEM TOTAL", right=True, width=10),
                  Column("TEMP C", right=True, width=6), Column("POWER W", right=True, width=7),
                  Column("SM MHZ", right=True, width=6)]


def metric_rows(frame: dict) -> list[list[str]]:
    """One row per GPU reading of a metrics frame (a lease's: its GPU's); readings a GPU cannot give (null, such
    as a whole GPU's utilisation in MIG mode) are "-"."""
    at = datetime.fromtimestamp(frame.get("ts") or time.time()).strftime("%H:%M:%S")
    rows = []
    for g in frame.get("gpus") or []:
        def num(key):
            return f"{g[key]:.0f}" if isinstance(g.get(key), (int, float)) else "-"
        rows.append([at, num("util"), _mib(g.get("mem_used_mib")), _mib(g.get("mem_total_mib")), num("temp_c"),
                     num("power_w"), num("sm_clock_mhz")])
    return rows


def _mib(value) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value / 1024:.1f} GiB"


def metrics(ctx: Context) -> int:
    a = ctx.args
    if a.count < 1:
        raise UsageError("-n takes 1 or more")
    lid = resolve(a.lease, lease_ids_resolver(ctx), what="lease")
    with LeaseWatch(ctx.client.base_url, _key(ctx), lid) as watch:
        if not watch.subscribed:
            raise CliError(f"cannot watch lease {short_id(lid)}: it is not open ({watch.refusal})")
        shown = 0
        header = not ctx.json
        pending = list(watch.early)
        while a.follow or shown < a.count:
            frame = pending.pop(0) if pending else watch.next(METRICS_TIMEOUT)
            if frame is None:
                raise CliError(f"no metrics for lease {short_id(lid)} in {METRICS_TIMEOUT:g} s",
                               hint="is its node online? gpum lease show " + short_id(lid))
            if watch.is_over(frame):
                ctx.note(f"lease {short_id(lid)} is over")
                return 0
            if frame.get("type") != "metrics" or not frame.get("gpus"):
                continue
            shown += 1
            if ctx.json:  # one line per frame, as the socket sent it
                ctx.print(json.dumps(frame, separators=(",", ":")))
                continue
            text = render(METRIC_COLUMNS, metric_rows(frame)).splitlines()
            if header:
                ctx.print(text[0])
                header = False
            for line in text[1:]:
                ctx.print(line)
    return 0
