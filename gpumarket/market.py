"""Commands of the market: offers, templates, order (on-demand, spot, reserved; show, cancel), orders,
reservations, resale (list, buy, sell, withdraw)."""
from __future__ import annotations

import argparse
import time

from . import parse
from .context import Context, command, confirm
from .errors import CliError
from .leases import print_lease_facts
from .resolve import resolve
from .table import Column, duration, local_time, pairs, parse_time, relative, short_id, usd

MODES = {"on-demand": "on_demand", "reserved": "reserved", "reserved-short-notice": "reserved_short_notice",
         "spot": "spot", "resale": "resale"}
SORTS = ("price", "pu_per_dollar", "reliability", "availability", "memory_gb", "pu")
WAIT_POLL_SECONDS = 1.0


def _mode(text: str) -> str:
    t = text.strip().lower().replace("_", "-")
    if t not in MODES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mode: {', '.join(MODES)}")
    return MODES[t]


def _sort(text: str) -> str:
    t = text.strip().lower().replace("-", "_")
    desc = t.startswith("_") or text.startswith("-")
    name = t.lstrip("_")
    if name not in SORTS:
        raise argparse.ArgumentTypeError(f"{text!r}: sort by {', '.join(SORTS)} (prefix - for descending)")
    return f"-{name}" if desc else name


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number above 0")
    return int(text)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0 or value != value:
        raise argparse.ArgumentTypeError(f"{text!r} cannot be negative")
    return value


def register(sub, parent) -> None:
    # --- offers ----------------------------------------------------------------------------------------------------
    p = command(sub, "offers", parent, "search the catalog: GPU model x slice profile x region, priced per mode",
                description="The catalog's offers (units): what could be placed now, performance units (PU), the "
                            "price in --mode and $ per PU-hour. Filters are the catalog API's. An offer's ID "
                            "(MODEL:PROFILE:REGION) is what `gpum order ... --offer` takes.",
                epilog="examples:\n  gpum offers --model h100-80gb --available\n"
                       "  gpum offers --min-memory 40 --mode spot --sort pu_per_dollar --desc\n"
                       "  gpum offers --region eu-west --max-price 2.50 --json")
    p.add_argument("--model", help="a GPU model's catalog key (h100-80gb, a100-40gb, l4, ...)")
    p.add_argument("--min-memory", type=_number, metavar="GB", help="at least this much GPU memory per slice")
    p.add_argument("--region", help="only this region")
    p.add_argument("--mode", type=_mode, default="on_demand",
                   help="price in this mode: on-demand (default), reserved, reserved-short-notice, spot, resale")
    p.add_argument("--max-price", type=parse.price, metavar="USD", help="at most this per hour in --mode")
    p.add_argument("--min-cuda", metavar="VERSION", help="nodes with at least this CUDA version (12.4)")
    p.add_argument("--min-compute-capability", metavar="VERSION", help="at least this compute capability (8.0)")
    p.add_argument("--min-reliability", type=_number, metavar="SHARE", help="nodes' reliability at least (0..1)")
    p.add_argument("--min-pu-per-dollar", type=_number, metavar="PU", help="at least this many PU per $")
    p.add_argument("--available", action="store_true", help="only offers that could be placed now")
    p.add_argument("--gpus", type=_positive, metavar="N",
                   help="at least N available now: N GPUs of a whole-GPU offer, N slices of a MIG one (a multi-GPU "
                        "order needs N whole GPUs on one node)")
    p.add_argument("--sort", type=_sort, default="price",
                   help=f"order by {', '.join(SORTS)} (default price; --sort=-pu is descending, as --desc)")
    p.add_argument("--desc", action="store_true", help="highest first")
    p.set_defaults(run=offers)

    p = command(sub, "templates", parent, "the operator's workload templates (--template KEY)")
    p.set_defaults(run=templates)

    # --- order -----------------------------------------------------------------------------------------------------
    p = command(sub, "order", parent, "order capacity: on-demand, spot or reserved; show or cancel an order",
                description="Place an order (on-demand, spot, reserved), or show or cancel one. Constraints choose "
                            "the slice (or --offer from `gpum offers`); workload flags choose what runs on it. "
                            "Resold windows are bought with `gpum resale buy`.")
    orders_sub = p.add_subparsers(title="order commands", metavar="MODE|ACTION", required=True)
    for mode, what in (("on-demand", "billed per second while it runs, until you end it or --duration"),
                       ("spot", "interruptible, at the spot price while it stays under your --bid"),
                       ("reserved", "a booked window (--start, --hours), paid when booked")):
        o = command(orders_sub, mode, parent, f"order {mode}: {what}",
                    epilog=_ORDER_EXAMPLES[mode])
        _order_flags(o, mode)
        o.set_defaults(run=order_place, mode=MODES[mode])
    o = command(orders_sub, "show", parent, "one of your orders: its state, why it waits, its leases")
    o.add_argument("order", help="the order's ID (or a unique prefix)")
    o.set_defaults(run=order_show)
    o = command(orders_sub, "cancel", parent, "cancel an order: a queued one is withdrawn; a placed on-demand or "
                                              "spot order's leases end")
    o.add_argument("order", help="the order's ID (or a unique prefix)")
    o.add_argument("-y", "--yes", action="store_true", help="do not ask")
    o.set_defaults(run=order_cancel)

    p = command(sub, "orders", parent, "your orders, newest first (--state queued: those waiting for capacity)")
    p.add_argument("--state", choices=["queued", "placed", "failed", "cancelled"], help="only this state")
    p.add_argument("--mode", type=_mode, help="only this mode")
    p.add_argument("--limit", type=_positive, default=50, metavar="N", help="the newest N (default 50)")
    p.set_defaults(run=orders_list)

    p = command(sub, "reservations", parent, "your reserved windows (what `gpum resale sell` lists)")
    p.set_defaults(run=reservations)

    # --- resale ----------------------------------------------------------------------------------------------------
    p = command(sub, "resale", parent, "reserved time for resale: list, buy, sell, withdraw",
                description="The resale market: holders of reserved windows offer a future part of them at an ask "
                            "capped at 0.9 x the unit's base price.")
    rs = p.add_subparsers(title="resale commands", metavar="ACTION", required=True)
    r = command(rs, "list", parent, "open listings", aliases=["ls"])
    r.add_argument("--model", help="GPU model key")
    r.add_argument("--region")
    r.add_argument("--profile", help="slice profile (3g.40gb) or whole")
    r.add_argument("--max-ask", type=parse.price, metavar="USD", help="ask per hour at most")
    r.add_argument("--after", type=parse.when, metavar="TIME", help="starting at or after (ISO 8601 or +2h)")
    r.set_defaults(run=resale_list)
    r = command(rs, "buy", parent, "buy a listing's window: it becomes your reservation, paid now",
                epilog="example:\n  gpum resale buy 3c4d")
    r.add_argument("listing", help="the listing's ID (or a unique prefix)")
    r.set_defaults(run=resale_buy)
    r = command(rs, "sell", parent, "offer a future part of one of your reservations",
                epilog="example:\n  gpum resale sell 9f8e --start +1h --hours 2 --ask 1.10")
    r.add_argument("reservation", help="the reservation's ID (or a unique prefix; gpum reservations)")
    r.add_argument("--start", type=parse.when, required=True, metavar="TIME",
                   help="the part's start (ISO 8601, local time without a zone, or +DURATION)")
    r.add_argument("--hours", type=parse.hours, help="the part's length in hours")
    r.add_argument("--end", type=parse.when, metavar="TIME", help="or its end")
    r.add_argument("--ask", type=parse.price, required=True, metavar="USD", help="your price per hour")
    r.set_defaults(run=resale_sell)
    r = command(rs, "withdraw", parent, "take one of your open listings back")
    r.add_argument("listing", help="the listing's ID (or a unique prefix)")
    r.set_defaults(run=resale_withdraw)


_ORDER_EXAMPLES = {
    "on-demand": "examples:\n"
                 "  gpum order on-demand --offer a100-80gb:1g.10gb:eu-west --image docker.io/me/trainer:3 \\\n"
                 "      --cmd 'python train.py' --env EPOCHS=3 --secret-env HF_TOKEN --job --max-duration 2h --wait\n"
                 "  gpum order on-demand --model h100-80gb --memory 40 --template ubuntu-ssh --port 22 --wait\n"
                 "  gpum order on-demand --model h100-80gb --gpus 4 --duration 8h --queue",
    "spot": "example:\n  gpum order spot --model a100-80gb --memory 20 --bid 0.80 --template pytorch --port 22 --wait",
    "reserved": "example:\n  gpum order reserved --offer h100-80gb:whole:eu-west --start 2026-12-01T09:00 --hours 4",
}


def _order_flags(p: argparse.ArgumentParser, mode: str) -> None:
    what = p.add_argument_group("what to run on (constraints)")
    what.add_argument("--offer", type=parse.offer, metavar="MODEL:PROFILE:REGION",
                      help="an offer's ID from `gpum offers`: its model, slice size and region")
    what.add_argument("--model", action="append", metavar="KEY", help="allowed GPU model (repeat for several)")
    what.add_argument("--memory", type=_number, metavar="GB", help="GPU memory of the slice, at least")
    what.add_argument("--compute-slices", type=_positive, metavar="N", help="compute slices of a MIG slice")
    what.add_argument("--whole-gpu", action="store_true", help="a whole GPU, not a MIG slice")
    if mode != "reserved":
        what.add_argument("--gpus", type=_positive, metavar="N",
                          help="N whole GPUs on one node (1-8), one lease each")
    what.add_argument("--region", action="append", metavar="REGION", help="allowed region (repeat for several)")
    what.add_argument("--min-cuda", metavar="VERSION", help="nodes with at least this CUDA version")
    what.add_argument("--min-compute-capability", metavar="VERSION", help="at least this compute capability")
    what.add_argument("--buyer-region", metavar="REGION", help="where you are (closer nodes score higher)")

    how = p.add_argument_group("terms")
    if mode == "spot":
        how.add_argument("--bid", type=parse.price, required=True, metavar="USD",
                         help="the most you pay per hour (for all --gpus together); at most the on-demand price")
    else:
        how.add_argument("--max-price", type=parse.price, metavar="USD",
                         help="refuse a placement costing more per hour than this")
    if mode == "reserved":
        how.add_argument("--start", type=parse.when, required=True, metavar="TIME",
                         help="the window's start: ISO 8601 (2026-12-01T09:00Z; local time without a zone) or "
                              "+DURATION from now (+2h); booked 1 h ahead it is cheaper")
        how.add_argument("--hours", type=parse.hours, help="the window's length in hours")
        how.add_argument("--end", type=parse.when, metavar="TIME", help="or its end")
    else:
        how.add_argument("--duration", "--max-duration", type=parse.duration, metavar="DURATION",
                         help="end after this much running time (90m, 2h, 1d); with --job, the job's longest run")
    how.add_argument("--queue", action="store_true",
                     help="wait in the queue when nothing fits now (default: refuse at once)")
    how.add_argument("--priority", type=int, help="among your queued orders, higher first")
    how.add_argument("--project", type=int, metavar="ID", help="book the charges under this project")
    how.add_argument("--webhook", metavar="URL", help="this order's notices go to this URL")

    run = p.add_argument_group("workload (the container each lease runs; none: the slice is yours to use)")
    run.add_argument("--template", metavar="KEY", help="an operator's template (gpum templates)")
    run.add_argument("--image", metavar="REF", help="an image reference, e.g. docker.io/library/ubuntu:24.04")
    run.add_argument("--cmd", type=parse.words, metavar="COMMAND",
                     help="the command to run, replacing the image's entrypoint: 'python train.py --epochs 3'")
    run.add_argument("--args", type=parse.words, metavar="ARGS",
                     help="arguments replacing the image's own command (its entrypoint kept): '--epochs 3' (one "
                          "starting with - as --args=--fast)")
    run.add_argument("--env", type=parse.env_pair, action="append", metavar="NAME=VALUE",
                     help="an environment variable (repeat)")
    run.add_argument("--secret-env", type=parse.secret_pair, action="append", metavar="NAME[=VALUE]",
                     help="a variable never shown back or logged; NAME alone takes its value from your environment "
                          "(keeps it off the command line)")
    run.add_argument("--port", dest="ports", type=parse.port, action="append", metavar="PORT[/PROTO]",
                     help="publish a container port: 22 (ssh), 8888/http (a URL), 9000/udp, 5000/tcp (repeat)")
    run.add_argument("--disk", type=_positive, metavar="GB", help="disk for the container")
    run.add_argument("--job", action="store_true",
                     help="a job: runs to completion, the lease ends at its exit, billed while it ran")
    if mode == "spot":
        run.add_argument("--notice", choices=["sigterm", "file"],
                         help="how an interruption's notice reaches the container (default sigterm)")

    p.add_argument("--wait", action="store_true",
                   help="wait until its leases run (through a queue too) and print how to reach them")
    p.add_argument("--timeout", type=parse.duration, default=900, metavar="DURATION",
                   help="with --wait, give up after this long (default 15m; the order stays)")


# --- offers and templates ------------------------------------------------------------------------------------------

def offers(ctx: Context) -> int:
    a = ctx.args
    params = {"gpu_model": a.model, "min_memory_gb": a.min_memory, "region": a.region, "mode": a.mode,
              "max_price": a.max_price, "min_cuda": a.min_cuda, "min_compute_capability": a.min_compute_capability,
              "min_reliability": a.min_reliability, "min_pu_per_dollar": a.min_pu_per_dollar,
              "available": "true" if a.available else None,
              "ordering": f"-{a.sort}" if a.desc and not a.sort.startswith("-") else a.sort}
    body = ctx.client.get("offers/", params, auth=False)
    found = body["results"]
    if a.gpus:
        found = [o for o in found if o["availability"] >= a.gpus]
    if ctx.json:
        ctx.emit(found)
        return 0
    mode = a.mode
    others = [m for m in ("on_demand", "spot", "reserved") if m != mode]
    columns = [Column("OFFER"), Column("MEM GB", right=True), Column("PU", right=True),
               Column("FREE", right=True), Column(f"{_label(mode)} $/H", right=True),
               Column("$/PU-H", right=True, drop=3)]
    columns += [Column(f"{_label(m)} $/H", right=True, drop=5 - i) for i, m in enumerate(others)]
    columns += [Column("RELIAB", right=True, drop=6), Column("CUDA", drop=7)]
    rows = []
    for o in found:
        prices = o.get("prices") or {}
        rows.append([o["id"], f"{o['memory_gb']:g}", f"{o['pu']:.2f}", o["availability"], _price(prices.get(mode)),
                     _price(o.get("usd_per_pu_hour"))]
                    + [_price(prices.get(m)) for m in others]
                    + [f"{o['reliability']:.2f}", o.get("cuda_version") or "-"])
    ctx.table(columns, rows, empty="no offers match")
    return 0


def _label(mode: str) -> str:
    return mode.replace("_", "-").upper()


def _price(value) -> str:
    """A price in a table's $/H column: 4 places, so that a column reads at a glance (--json has them exact)."""
    return usd(value, places=4).lstrip("$") if value not in (None, "") else "-"


def templates(ctx: Context) -> int:
    return ctx.listing(ctx.client.all_pages("templates/"),
                       [Column("KEY"), Column("NAME", shrink=True), Column("IMAGE", shrink=True), Column("KIND"),
                        Column("PORTS", drop=1)],
                       lambda t: [t["key"], t["name"], t["image"], t["kind"],
                                  " ".join(f"{p['port']}/{p.get('kind') or p.get('protocol', 'tcp')}"
                                           for p in t.get("ports") or [])],
                       empty="no templates")


# --- orders --------------------------------------------------------------------------------------------------------

def order_ids(ctx: Context):
    return lambda: [o["id"] for o in ctx.client.pages("orders/")]


def order_place(ctx: Context) -> int:
    body = parse.order_body(ctx.args, ctx.args.mode)
    order = ctx.client.post("orders/", body)
    if not ctx.args.wait:
        if ctx.json:
            ctx.emit(order)
        else:
            ctx.print(_order_line(order))
            for lease_id in order["leases"]:
                ctx.print(f"  lease {short_id(lease_id)}: gpum lease show {short_id(lease_id)}")
        return 0
    leases = wait_for_leases(ctx, order, timeout=ctx.args.timeout)
    if ctx.json:
        ctx.emit({"order": ctx.client.get(f"orders/{order['id']}/"), "leases": leases})
        return 0
    ctx.print(_order_line(order))
    for lease in leases:
        ctx.print("")
        print_lease_facts(ctx, lease)
    return 0


def _why_queued(order: dict) -> str:
    """Why a queued order waits, in the buyer's words: the market's sentence ("No node has 8 whole GPUs free at or
    under your price cap of $0.5000/h: ..."), else the engine's reasons, else that nothing fits now."""
    return order.get("explain") or "; ".join(order.get("reasons") or []) or "nothing fits now"


def _order_line(order: dict) -> str:
    what = f"{order['mode'].replace('_', '-')} order {short_id(order['id'])} {order['state']}"
    price = order.get("price_per_hour")
    if order["state"] == "queued":
        return f"{what}: {_why_queued(order)}"
    if order["mode"] == "reserved" and order.get("total_price"):
        return f"{what}: {usd(order['total_price'])} paid for the window " \
               f"{local_time(order.get('window_start'))} to {local_time(order.get('window_end'))}"
    return f"{what}" + (f" at {usd(price, per_hour=True)}" if price else "")


def wait_for_leases(ctx: Context, order: dict, *, timeout: float) -> list[dict]:
    """Poll the order and its leases until every lease runs; what changes is told on stderr. A failed order or
    lease is an error with the server's reason; so is the deadline (the order stays)."""
    deadline = time.monotonic() + timeout
    said = set()

    def say(text: str) -> None:
        if text not in said:
            said.add(text)
            ctx.note(text)

    while True:
        if order["state"] in ("failed", "cancelled"):
            raise CliError(f"order {short_id(order['id'])} {order['state']}: "
                           + ("; ".join(order.get("reasons") or []) or "no reason given"))
        if order["state"] == "queued":
            say(f"order {short_id(order['id'])} queued: {_why_queued(order)}")
        leases = [ctx.client.get(f"leases/{i}/") for i in order.get("leases") or []]
        if order["state"] == "placed" and not leases and order.get("window_start"):
            say(f"window booked from {local_time(order['window_start'])}: waiting for its lease to start "
                f"({relative(order['window_start'])})")
        for lease in leases:
            sid = short_id(lease["id"])
            if lease["state"] in ("failed", "ended"):
                raise CliError(f"lease {sid} {lease['state']}: {_why(lease)}",
                               hint=f"gpum lease show {sid}; gpum logs {sid}")
            if lease["state"] == "provisioning":
                w = lease.get("workload") or {}
                progress = f" {w['progress']}" if w.get("progress") not in (None, "") else ""
                say(f"lease {sid} provisioning" + (f": container {w['state']}{progress}" if w.get("state") else ""))
        if leases and all(x["state"] in ("running", "interrupting") for x in leases):
            return leases
        if time.monotonic() > deadline:
            raise CliError(f"gave up waiting after {duration(timeout)}: order {short_id(order['id'])} is "
                           f"{order['state']}" + (f", its leases {', '.join(x['state'] for x in leases)}"
                                                  if leases else ""),
                           hint=f"it goes on: gpum order show {short_id(order['id'])}")
        time.sleep(WAIT_POLL_SECONDS)
        order = ctx.client.get(f"orders/{order['id']}/")


def _why(lease: dict) -> str:
    w = lease.get("workload") or {}
    return lease.get("end_reason") or w.get("error") or "no reason given"


def order_show(ctx: Context) -> int:
    oid = resolve(ctx.args.order, order_ids(ctx), what="order")
    order = ctx.client.get(f"orders/{oid}/")
    if ctx.json:
        ctx.emit(order)
        return 0
    w = order.get("workload") or {}
    ctx.print(pairs([
        ("id", order["id"]), ("mode", order["mode"].replace("_", "-")), ("state", order["state"]),
        ("models", ", ".join(order.get("gpu_models") or []) or "any"),
        ("memory", f"{order['memory_gb']:g} GB" if order.get("memory_gb") else None),
        ("gpus", order.get("gpu_count") if (order.get("gpu_count") or 1) > 1 else None),
        ("regions", ", ".join(order.get("regions") or []) or None),
        ("price", usd(order["price_per_hour"], per_hour=True) if order.get("price_per_hour") else None),
        ("cap / bid", usd(order["max_price_per_hour"], per_hour=True) if order.get("max_price_per_hour") else None),
        ("paid", usd(order["total_price"]) if order.get("total_price") else None),
        ("window", f"{local_time(order['window_start'])} to {local_time(order['window_end'])}"
         if order.get("window_start") else None),
        ("duration", duration(order["duration_seconds"]) if order.get("duration_seconds") else None),
        ("created", f"{local_time(order['created_at'])} ({relative(order['created_at'])})"),
        ("waiting because", "; ".join(order.get("reasons") or []) if order["state"] == "queued" else None),
        ("workload", _workload_line(w) if w else None),
        ("leases", ", ".join(short_id(x) for x in order.get("leases") or []) or None),
        ("reservations", ", ".join(short_id(x) for x in order.get("reservations") or []) or None),
    ]))
    return 0


def _workload_line(w: dict) -> str:
    """An order's workload as shown: image or template, kind, ports and variable names (values never: a secret's
    is null anyway, and a plain one is not worth a line)."""
    parts = [w.get("image") or f"template {w.get('template')}", w.get("kind") or "interactive"]
    if w.get("ports"):
        parts.append("ports " + " ".join(f"{p['port']}/{p.get('protocol', 'tcp')}" for p in w["ports"]))
    if w.get("env"):
        parts.append("env " + " ".join(e["name"] + ("(secret)" if e.get("secret") else "") for e in w["env"]))
    return ", ".join(parts)


def order_cancel(ctx: Context) -> int:
    oid = resolve(ctx.args.order, order_ids(ctx), what="order")
    order = ctx.client.get(f"orders/{oid}/")
    if order["state"] == "placed" and order.get("leases"):
        confirm(ctx, f"Cancel order {short_id(oid)} and end its {len(order['leases'])} lease(s)?")
    order = ctx.client.post(f"orders/{oid}/cancel/")
    return ctx.result(order, f"order {short_id(oid)} {order['state']}")


def orders_list(ctx: Context) -> int:
    a = ctx.args
    found = ctx.client.all_pages("orders/", {"mode": a.mode, "state": a.state}, limit=a.limit)
    return ctx.listing(found, [Column("ID"), Column("MODE"), Column("STATE"), Column("MODELS", shrink=True),
                               Column("$/H", right=True), Column("LEASES", shrink=True, drop=1),
                               Column("CREATED", drop=2), Column("WAITING BECAUSE", shrink=True, drop=3)],
                       lambda o: [short_id(o["id"]), o["mode"].replace("_", "-"), o["state"],
                                  ",".join(o.get("gpu_models") or []) or "any", _price(o.get("price_per_hour")),
                                  " ".join(short_id(x) for x in o.get("leases") or []), relative(o["created_at"]),
                                  "; ".join(o.get("reasons") or []) if o["state"] == "queued" else ""],
                       empty="no orders")


def reservations(ctx: Context) -> int:
    return ctx.listing(ctx.client.all_pages("reservations/"),
                       [Column("ID"), Column("GPU", shrink=True), Column("REGION"), Column("STARTS"), Column("ENDS"),
                        Column("STATE"), Column("PAID", right=True)],
                       lambda r: [short_id(r["id"]), f"{r.get('gpu_model')} {r.get('profile') or 'whole'}",
                                  r["region"], local_time(r["starts_at"]), local_time(r["ends_at"]), r["state"],
                                  usd(r["price_total"])],
                       empty="no reservations")


# --- resale --------------------------------------------------------------------------------------------------------

def _listings(ctx: Context, params: dict | None = None) -> list[dict]:
    return ctx.client.all_pages("resale-listings/", params, auth=False)


def resale_list(ctx: Context) -> int:
    a = ctx.args
    after = parse.iso(a.after) if a.after else None
    found = _listings(ctx, {"gpu_model": a.model, "region": a.region, "profile": a.profile, "max_ask": a.max_ask,
                            "starts_after": after})
    return ctx.listing(found, [Column("ID"), Column("GPU", shrink=True), Column("REGION"), Column("STARTS"),
                               Column("HOURS", right=True), Column("ASK $/H", right=True), Column("TOTAL", right=True)],
                       lambda x: [short_id(x["id"]), f"{x['gpu_model']} {x.get('profile') or 'whole'}", x["region"],
                                  local_time(x["starts_at"]), f"{_hours(x['starts_at'], x['ends_at']):g}",
                                  _price(x["ask_per_hour"]), usd(x["price_total"])],
                       empty="no open listings")


def _hours(start: str, end: str) -> float:
    a, b = parse_time(start), parse_time(end)
    return round((b - a).total_seconds() / 3600, 2) if a and b else 0


def _listing_id(ctx: Context) -> str:
    return resolve(ctx.args.listing, lambda: [x["id"] for x in _listings(ctx)], what="open listing", owned=False)


def resale_buy(ctx: Context) -> int:
    lid = _listing_id(ctx)
    bought = ctx.client.post(f"resale-listings/{lid}/buy/")
    res, listing = bought["reservation"], bought["listing"]
    return ctx.result(bought, f"Bought listing {short_id(lid)} for {usd(listing['price_total'])}: reservation "
                              f"{short_id(res['id'])} on {res.get('gpu_model')} {res.get('profile') or 'whole'} in "
                              f"{res['region']}, {local_time(res['starts_at'])} to {local_time(res['ends_at'])}; its "
                              "lease starts then")


def resale_sell(ctx: Context) -> int:
    a = ctx.args
    starts_at, ends_at = parse.window(a.start, hours=a.hours, end=a.end)
    rid = resolve(a.reservation, lambda: [r["id"] for r in ctx.client.pages("reservations/")], what="reservation")
    body = {"starts_at": starts_at, "ends_at": ends_at, "ask_per_hour": a.ask}
    listing = ctx.client.post(f"reservations/{rid}/list-for-resale/", body)
    return ctx.result(listing, f"Listed {local_time(listing['starts_at'])} to {local_time(listing['ends_at'])} of "
                               f"reservation {short_id(rid)} at {usd(listing['ask_per_hour'], per_hour=True)} "
                               f"({usd(listing['price_total'])} in all): listing {short_id(listing['id'])}")


def resale_withdraw(ctx: Context) -> int:
    lid = _listing_id(ctx)
    listing = ctx.client.post(f"resale-listings/{lid}/withdraw/")
    return ctx.result(listing, f"listing {short_id(lid)} {listing['state']}")

