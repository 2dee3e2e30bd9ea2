"""Commands of money: balance, statements, topup."""
from __future__ import annotations

import uuid

from . import parse
from .context import Context, command
from .errors import UsageError
from .table import Column, local_time, pairs, usd

RECENT = 10


def register(sub, parent) -> None:
    p = command(sub, "balance", parent, "your wallet's balance (and earnings), with its latest movements")
    p.set_defaults(run=balance)

    p = command(sub, "statements", parent, "a month's statement: usage per project and slice, other charges, the "
                                           "wallet's opening and closing balance",
                epilog="examples:\n  gpum statements\n  gpum statements --month 2026-10 --csv > 2026-10.csv")
    p.add_argument("--month", type=parse.month, metavar="YYYY-MM", help="which month (default: this one, UTC)")
    p.add_argument("--project", type=int, metavar="ID", help="only this project")
    p.add_argument("--csv", action="store_true", help="the statement as CSV (the server's), for a spreadsheet")
    p.set_defaults(run=statements)

    p = command(sub, "topup", parent, "add money to your wallet with a card (Stripe)",
                description="Top up the wallet: the server creates a Stripe payment and, with --card, confirms it "
                            "(test-mode cards: 4242424242424242 pays, 4000000000000341 is declined). Without "
                            "--card, pay on the console's Billing page (Stripe.js keeps the card off this machine).",
                epilog="example:\n  gpum topup 25 --card 4242424242424242")
    p.add_argument("amount", type=parse.price, help="USD, whole cents (1.00 to 10000.00)")
    p.add_argument("--card", metavar="NUMBER", help="a card number to confirm with on the server (16 digits)")
    p.set_defaults(run=topup)


def balance(ctx: Context) -> int:
    wallet = ctx.client.get("wallet/")
    if ctx.json:
        ctx.emit(wallet)
        return 0
    items = [("balance", f"{usd(wallet['balance'])} {wallet.get('currency', 'usd').upper()}")]
    if wallet.get("earnings_balance") not in (None, "", "0", "0.000000"):
        items.append(("earnings", usd(wallet["earnings_balance"])))
    ctx.print(pairs(items))
    recent = (wallet.get("recent_entries") or [])[:RECENT]
    if recent:
        ctx.print("")
        ctx.table([Column("WHEN"), Column("KIND"), Column("AMOUNT", right=True), Column("MEMO", shrink=True, drop=1)],
                  [[local_time(e["created_at"]), e["transaction"]["kind"], usd(e["amount"]), e["transaction"]["memo"]]
                   for e in recent])
    return 0


def statements(ctx: Context) -> int:
    a = ctx.args
    params = {"month": a.month, "project": a.project}
    if a.csv:
        ctx.out.write(ctx.client.get("statements/", params, accept="text/csv"))
        ctx.out.flush()
        return 0
    body = ctx.client.get("statements/", params)
    if ctx.json:
        ctx.emit(body)
        return 0
    ctx.print(f"Statement {body['month']} ({body.get('currency', 'usd').upper()}), "
              f"{local_time(body['period_start'])} to {local_time(body['period_end'])}")
    rows = []
    for p in body["projects"]:
        name = (p["project"] or {}).get("name") or "(no project)"
        for s in p["slices"]:
            rows.append([name, f"usage {s['gpu_model']} {s['profile']}", s["gpu_hours"], usd(s["amount"])])
        for c in p["other_charges"]:
            rows.append([name, c["kind"], "", usd(c["amount"])])
        rows.append([name, "project total", "", usd(p["total"])])
    ctx.print("")
    ctx.table([Column("PROJECT", shrink=True), Column("ITEM", shrink=True), Column("GPU-HOURS", right=True),
               Column("AMOUNT", right=True)], rows, empty="nothing was charged this month")
    t = body["totals"]
    items = [("total", usd(t["amount"])), ("usage", usd(t["usage_amount"])),
             ("other charges", usd(t["other_charges_amount"]))]
    if body.get("wallet"):
        items += [("opening balance", usd(body["wallet"]["opening_balance"])),
                  ("closing balance", usd(body["wallet"]["closing_balance"]))]
    ctx.print("")
    ctx.print(pairs(items))
    return 0


def topup(ctx: Context) -> int:
    a = ctx.args
    if not a.card:
        raise UsageError("a top-up without --card is paid in the browser",
                         hint=f"open {ctx.client.base_url}/billing/ (or give --card NUMBER on a test server)")
    # One key per invocation: the client's own retry (a 503 with Retry-After) cannot pay twice.
    body = ctx.client.post("topups/", {"amount": a.amount, "card": a.card.replace(" ", "")},
                           headers={"Idempotency-Key": f"gpum-{uuid.uuid4()}"})
    payment = body["payment"]
    return ctx.result(body, f"Paid {usd(payment['amount'])}: your wallet is credited (gpum balance)"
                      if payment["status"] == "succeeded" else
                      f"Payment {payment['status']}: the wallet is credited once Stripe confirms it (gpum balance)")
