"""Output for people: tables that fit the terminal, aligned key/value blocks, and the few formats every command
shares (money, times, durations, short IDs). Pure functions of their input."""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

GAP = "  "
MIN_SHRUNK = 8  # a shrinkable column keeps at least this many characters (or its header's)


@dataclass(frozen=True)
class Column:
    """`shrink`: may be cut (with an ellipsis) to fit; `drop`: dropped when even cutting does not fit, highest
    first (0: never); `right`: numbers, aligned right."""

    name: str
    right: bool = False
    shrink: bool = False
    drop: int = 0
    width: int = 0  # at least this wide: rows printed one at a time (a stream) line up under one header


def terminal_width(stream=None) -> int | None:
    """The width to fit: $COLUMNS, else the terminal's; None (no limit) when writing to a pipe or a file, so that
    scripts that grep a table get whole values."""
    stream = stream or sys.stdout
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    if stream.isatty():
        return shutil.get_terminal_size((100, 24)).columns
    return None


def _ellipsis() -> str:
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower()
    return "…" if encoding.startswith("utf") else "~"


def cut(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    return text[: width - 1] + _ellipsis()


def render(columns: list[Column], rows: list[list[str]], width: int | None = None) -> str:
    """The rows under a header, each column as wide as its widest cell; to fit `width`, shrinkable columns are cut
    (widest first), then droppable ones dropped (highest `drop` first). Empty rows: the header alone."""
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    keep = list(range(len(columns)))
    while True:
        widths = {i: max([len(columns[i].name), columns[i].width] + [len(r[i]) for r in cells]) for i in keep}
        if width is not None:
            _shrink(columns, widths, width)
        if width is None or _total(widths) <= width:
            break
        droppable = [i for i in keep if columns[i].drop]
        if not droppable:
            break  # nothing more to give: wider than the terminal, but whole
        keep.remove(max(droppable, key=lambda i: (columns[i].drop, i)))
    lines = [_line([columns[i].name for i in keep], [columns[i] for i in keep], [widths[i] for i in keep])]
    for r in cells:
        lines.append(_line([r[i] for i in keep], [columns[i] for i in keep], [widths[i] for i in keep]))
    return "\n".join(lines)


def _total(widths: dict[int, int]) -> int:
    return sum(widths.values()) + len(GAP) * (len(widths) - 1)


def _shrink(columns: list[Column], widths: dict[int, int], width: int) -> None:
    while _total(widths) > width:
        candidates = [i for i in widths if columns[i].shrink and widths[i] > max(MIN_SHRUNK, len(columns[i].name))]
        if not candidates:
            return
        widest = max(candidates, key=lambda i: widths[i])
        floor = max(MIN_SHRUNK, len(columns[widest].name))
        widths[widest] = max(floor, widths[widest] - (_total(widths) - width))


def _line(values: list[str], columns: list[Column], widths: list[int]) -> str:
    out = []
    for value, col, w in zip(values, columns, widths):
        value = cut(value, w)
        out.append(value.rjust(w) if col.right else value.ljust(w))
    return GAP.join(out).rstrip()


def pairs(items: list[tuple[str, object]]) -> str:
    """`key  value` lines, keys aligned; items whose value is None or "" are left out."""
    shown = [(k, str(v)) for k, v in items if v is not None and v != ""]
    if not shown:
        return ""
    w = max(len(k) for k, _ in shown)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in shown)


# --- values ------------------------------------------------------------------------------------------------------

def usd(value, *, per_hour: bool = False, places: int | None = None) -> str:
    """A money amount from the API (a decimal string, micro-dollars): $ with 2 to 6 places, no trailing zeros
    beyond cents (or exactly `places`, rounded half-up, for a column). None and "" are shown as "-"."""
    if value is None or value == "":
        return "-"
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return str(value)
    if places is not None:
        text = str(amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))
    else:
        text = f"{amount:.6f}".rstrip("0")
        whole, _, frac = text.partition(".")
        text = f"{whole}.{frac.ljust(2, '0')}"
    sign = "-" if text.startswith("-") else ""
    return f"{sign}${text.lstrip('-')}" + ("/h" if per_hour else "")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def duration(seconds: float) -> str:
    """1d 2h, 3h 5m, 4m 10s, 9s."""
    seconds = int(round(abs(seconds)))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m {secs}s" if secs else f"{minutes}m"
    return f"{secs}s"


def relative(value: str | None, now: datetime | None = None) -> str:
    """An API time as "5m ago" or "in 2h"; "-" when there is none."""
    when = parse_time(value)
    if when is None:
        return "-"
    now = now or datetime.now(timezone.utc)
    delta = (when - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {duration(delta)}" if delta > 0 else f"{duration(delta)} ago"


def local_time(value: str | None) -> str:
    """An API time in the user's time zone, to the minute: 2026-12-01 11:00 CET."""
    when = parse_time(value)
    if when is None:
        return "-"
    local = when.astimezone()
    return local.strftime("%Y-%m-%d %H:%M %Z").strip()


def short_id(value) -> str:
    """The first 8 characters of an ID: what tables show and what commands accept (with any longer prefix)."""
    return str(value or "")[:8]
