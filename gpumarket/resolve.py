"""IDs on the command line accept any unique prefix, as docker's do: `gpum lease show 1a2b` is the lease whose ID
starts with 1a2b, when only one of yours does."""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from .errors import NotFound, UsageError

FULL_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
PREFIX = re.compile(r"^[0-9a-f-]{1,36}$")


def _norm(text: str) -> str:
    return text.strip().lower()


def is_full(text: str) -> bool:
    return bool(FULL_UUID.match(_norm(text)))


def match(prefix: str, ids: Iterable[str], *, what: str, owned: bool = True) -> str:
    """The one ID in `ids` starting with `prefix` (dashes optional); NotFound for none, UsageError for several.
    `owned`: the IDs are the user's own (the message says "of yours")."""
    wanted = _norm(prefix)
    if not PREFIX.match(wanted):
        raise UsageError(f"{prefix!r} is not a {what} ID (hexadecimal, as `gpum` lists them)")
    bare = wanted.replace("-", "")
    found = sorted({i for i in ids if str(i).lower().replace("-", "").startswith(bare)})
    if not found:
        raise NotFound(f"no {what}{' of yours' if owned else ''} has an ID starting with {prefix}")
    if len(found) > 1:
        shown = ", ".join(f[:12] for f in found[:5]) + (", ..." if len(found) > 5 else "")
        raise UsageError(f"{prefix} names {len(found)} {what}s ({shown}): give more of the ID")
    return found[0]


def resolve(prefix: str, list_ids: Callable[[], Iterable[str]], *, what: str, owned: bool = True) -> str:
    """A full ID as given (the server says whether it exists); a prefix looked up among `list_ids()`."""
    if is_full(prefix):
        return _norm(prefix)
    return match(prefix, list_ids(), what=what, owned=owned)
