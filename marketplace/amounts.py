"""Money amounts: Decimal micro-dollars (six places), never float, and the one rounding rule.

Every amount the market charges, credits or refunds is exact to the micro-dollar: a price per hour times
seconds is rounded half-up once, where it is charged (`cost`). Only Stripe moves whole cents (top-ups and
their refunds, payments.py). Sharing an amount over parts (minutes of a charge, pieces of a split window)
gives parts that add up to exactly the amount, none negative (`spread`).

How people read money (the console, and every message a buyer or provider reads: form errors, refusals) is
written here too, once: an amount to the cent, a price per hour to a hundredth of a cent (`usd`, `usd_per_hour`).
"""
from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from scheduler.errors import DomainError

MICRO = Decimal("0.000001")
CENT = Decimal("0.01")
ZERO = Decimal("0")


def micro(value) -> Decimal:
    """`value` rounded half-up to the micro-dollar."""
    return Decimal(value).quantize(MICRO, rounding=ROUND_HALF_UP)


def cents(value) -> Decimal:
    """`value` rounded half-up to the cent (what Stripe moves, and what the console shows)."""
    return Decimal(value).quantize(CENT, rounding=ROUND_HALF_UP)


def in_cents(value: Decimal) -> int:
    """A whole-cent amount as the integer cents Stripe takes."""
    return int((Decimal(value) * 100).to_integral_value())


def usd(value, places: int = 2) -> str:
    """An amount as people read it: dollars rounded half-up to `places` (2: the cent), thousands separated, a
    true minus sign: 1234.5 -> "$1,234.50", -0.2 -> "−$0.20". An amount of cents (places=2) that is not zero
    but rounds to $0.00 is written to a hundredth of a cent ("$0.0041", or the micro-dollar), so nothing charged
    reads as free."""
    if value in (None, ""):
        return "—"
    try:
        d = Decimal(str(value))
        places = int(places)
        shown = d.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
        if places == 2:
            for finer in (4, 6):
                if shown or not d:
                    break
                places, shown = finer, d.quantize(Decimal(1).scaleb(-finer), rounding=ROUND_HALF_UP)
    except (ArithmeticError, ValueError, TypeError):
        return str(value)
    sign = "−" if shown < 0 else ""
    return f"{sign}${abs(shown):,.{places}f}"


def usd_per_hour(value) -> str:
    """A price per hour as people read it: "$0.6943/h" (prices are per second of an hour: four places)."""
    return f"{usd(value, 4)}/h"


def money(value, *, field: str = "amount") -> Decimal:
    """`value` as an exact micro-dollar Decimal; refuses floats, NaN/inf and sub-micro precision (rounding
    there would silently create or destroy money: callers round with `micro`)."""
    if isinstance(value, (float, bool)):
        raise TypeError(f"{field}: money is Decimal or str, never float or bool ({value!r})")
    try:
        d = value if isinstance(value, Decimal) else Decimal(value)
    except Exception:  # decimal.InvalidOperation and friends
        raise DomainError(f"{field} is not a number", field=field) from None
    if not d.is_finite():
        raise DomainError(f"{field} must be a finite number", field=field)
    q = d.quantize(MICRO)
    if q != d:
        raise DomainError(f"{field} has more than six decimal places", field=field)
    return q


def cost(*, per_hour: Decimal, seconds: float | int | Decimal) -> Decimal:
    """What `seconds` at `per_hour` cost, to the micro-dollar."""
    return micro(Decimal(per_hour) * Decimal(str(seconds)) / Decimal(3600))


def spread(amount: Decimal, weights: list) -> list[Decimal]:
    """`amount` shared over `weights` in micro-dollars adding up to exactly it, none negative: each piece is the
    step between rounded-down cumulative shares (rounding each piece alone could give sixty pieces of a tiny
    charge more than the charge, and the last piece a negative amount). Zero weights get zero."""
    units = int(money(amount) / MICRO)
    ws = [Decimal(str(max(w, 0))) for w in weights]
    total = sum(ws, ZERO)
    if total <= 0:
        return [ZERO.quantize(MICRO)] * len(weights)
    out, before, seen = [], 0, ZERO
    for w in ws:
        seen += w
        upto = int(units * seen // total)
        out.append(Decimal(upto - before) * MICRO)
        before = upto
    return out


def spread_within(part: Decimal, amounts: list[Decimal], weights: list) -> list[Decimal]:
    """`part` (a fee, never more than the sum of `amounts`) spread like `amounts`, no piece above its amount;
    what rounding leaves goes to the pieces with room, latest first."""
    pieces = [min(p, a) for p, a in zip(spread(part, weights), amounts)]
    left = part - sum(pieces, ZERO)
    for i in reversed(range(len(pieces))):
        if left <= 0:
            break
        add = min(left, amounts[i] - pieces[i])
        pieces[i] += add
        left -= add
    return pieces
