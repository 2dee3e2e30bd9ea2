"""Strict helpers that read settings from the environment.

A malformed value stops start-up with a message naming the variable: a typo in production must not
silently fall back to a default.
"""
from __future__ import annotations

import math
import os
import re
from decimal import Decimal, InvalidOperation
from urllib.parse import parse_qs, unquote, urlparse


class ImproperlyConfiguredEnv(Exception):
    """Raised at start-up for a malformed environment variable."""

    def __init__(self, name: str, problem: str):
        super().__init__(f"environment variable {name}: {problem}")
        self.name = name


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_str(name: str, default: str | None = None) -> str | None:
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfiguredEnv(name, f"expected a boolean (1/0, true/false, yes/no, on/off), got {value!r}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfiguredEnv(name, f"expected an integer, got {value!r}") from None
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise ImproperlyConfiguredEnv(name, f"{number} is outside [{minimum}, {maximum}]")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfiguredEnv(name, f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ImproperlyConfiguredEnv(name, f"expected a finite number, got {value!r}")
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise ImproperlyConfiguredEnv(name, f"{number} is outside [{minimum}, {maximum}]")
    return number


def env_decimal(name: str, default: str, *, minimum: Decimal | None = None,
                maximum: Decimal | int | None = None) -> Decimal:
    value = _raw(name) or default
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise ImproperlyConfiguredEnv(name, f"expected a decimal number, got {value!r}") from None
    if not number.is_finite() or (minimum is not None and number < minimum) or (
            maximum is not None and number > maximum):
        raise ImproperlyConfiguredEnv(name, f"{value} is not a valid amount (between {minimum} and {maximum})")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_int_list(name: str, default: list[int]) -> list[int]:
    """Comma-separated integers ("48,79")."""
    items = env_list(name, [str(d) for d in default])
    try:
        return [int(item) for item in items]
    except ValueError:
        raise ImproperlyConfiguredEnv(name, f"expected comma-separated integers, got {','.join(items)!r}") from None


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (as written, lower case)."""
    value = (env_str(name, default) or default).lower()
    if value not in choices:
        raise ImproperlyConfiguredEnv(name, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


_RATE = re.compile(r"^\d+/(s|sec|second|m|min|minute|h|hour|d|day)$")


def env_rate(name: str, default: str) -> str:
    """A DRF throttle rate such as "100/min" (checked here, or DRF would fail on the first request)."""
    value = env_str(name, default)
    if not _RATE.match(value):
        raise ImproperlyConfiguredEnv(name, f"expected a rate like 100/min or 5/second, got {value!r}")
    return value


_MAILBOX = re.compile(r"^[^@\s<>\"]+@[^@\s<>\"]+\.[^@\s<>\"]+$|^[^@\s<>\"]+@localhost$")


def env_email(name: str, default: str) -> str:
    """A sender address, bare or with a display name: "noreply@example.org" or "GPU Market <noreply@example.org>"."""
    from email.utils import parseaddr

    value = env_str(name, default)
    display, address = parseaddr(value)
    if not address or not _MAILBOX.match(address) or (display and "<" not in value):
        raise ImproperlyConfiguredEnv(name, f"expected an e-mail address (name@example.org, or "
                                            f"'Name <name@example.org>'), got {value!r}")
    return value


_LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def env_log_level(name: str, default: str) -> str:
    value = env_str(name, default).upper()
    if value not in _LOG_LEVELS:
        raise ImproperlyConfiguredEnv(name, f"expected one of {', '.join(_LOG_LEVELS)}, got {value!r}")
    return value


class DbPool:
    """A web or worker process's PostgreSQL connections (docs/deployment.md: processes x max_size must stay under
    the server's max_connections less a reserve). max_size 0: no pool in the process, a PgBouncer pools instead."""

    TIMEOUT_SECONDS = 30.0  # how long a request waits for a connection (DB_POOL_TIMEOUT)

    def __init__(self, *, min_size: int = 2, max_size: int = 10, timeout: float = TIMEOUT_SECONDS,
                 max_idle: float = 60.0):
        self.min_size, self.max_size, self.timeout, self.max_idle = min_size, max_size, timeout, max_idle

    @classmethod
    def from_env(cls) -> "DbPool":
        max_size = env_int("DB_POOL_MAX", 10, minimum=0, maximum=1000)
        min_size = env_int("DB_POOL_MIN", min(2, max_size), minimum=0, maximum=1000)
        if min_size > max_size:
            raise ImproperlyConfiguredEnv("DB_POOL_MIN", f"{min_size} is above DB_POOL_MAX {max_size}")
        return cls(min_size=min_size, max_size=max_size,
                   timeout=env_float("DB_POOL_TIMEOUT", cls.TIMEOUT_SECONDS, minimum=0.1, maximum=600))

    def options(self) -> dict:
        # Connections above min_size that sat idle this long are closed: a burst's connections do not stay open.
        return {"min_size": self.min_size, "max_size": self.max_size, "timeout": self.timeout,
                "max_idle": self.max_idle}


def database_from_url(name: str, url: str, *, pool: DbPool | None = None) -> dict:
    """Django DATABASES entry from postgres://user:pass@host:port/db or sqlite:///path.

    PostgreSQL connections come from a psycopg pool per process (`pool`, default DbPool()); a connection goes back
    to it at the end of each request or task (CONN_MAX_AGE 0), so idle ones are not held per thread."""
    parsed = urlparse(url)
    if parsed.scheme in ("postgres", "postgresql", "pgsql"):
        if not parsed.path or parsed.path == "/":
            raise ImproperlyConfiguredEnv(name, "a PostgreSQL URL needs a database name (postgres://host/dbname)")
        try:
            port = parsed.port
        except ValueError:
            raise ImproperlyConfiguredEnv(name, "the port is not a number") from None
        options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        pool = pool or DbPool()
        if pool.max_size:
            options["pool"] = pool.options()
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path[1:]),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(port or ""),
            "OPTIONS": options,
            # Under ASGI every request runs in its own thread: persistent connections (CONN_MAX_AGE > 0) piled
            # up one per thread until PostgreSQL refused clients. With the pool, closing returns a connection to it.
            "CONN_MAX_AGE": 0,
            "CONN_HEALTH_CHECKS": True,  # the pool checks a connection before lending it (a killed backend)
            # Without a pool a PgBouncer in transaction mode sits between: a server-side cursor would outlive the
            # transaction that PgBouncer gave its server connection for.
            "DISABLE_SERVER_SIDE_CURSORS": not pool.max_size,
        }
    if parsed.scheme == "sqlite":
        path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
        if not path:
            raise ImproperlyConfiguredEnv(name, "use sqlite:///relative/path.db or sqlite:////absolute/path.db")
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path}
    raise ImproperlyConfiguredEnv(name, f"unsupported scheme {parsed.scheme!r}: use postgres:// or sqlite:///")


_HEADER = re.compile(r"^([A-Za-z0-9-]+)\s*:\s*(\S+)$")


def proxy_ssl_header(name: str) -> tuple[str, str] | None:
    """Django's SECURE_PROXY_SSL_HEADER from "X-Forwarded-Proto: https" (unset: None, requests are as they came)."""
    value = _raw(name)
    if value is None:
        return None
    match = _HEADER.match(value)
    if not match:
        raise ImproperlyConfiguredEnv(name, f"expected a header and the value that means https, like "
                                            f"'X-Forwarded-Proto: https', got {value!r}")
    return "HTTP_" + match.group(1).upper().replace("-", "_"), match.group(2)


def redis_url(name: str) -> str | None:
    value = _raw(name)
    if value is None:
        return None
    parsed = urlparse(value)
    if parsed.scheme not in ("redis", "rediss") or not parsed.hostname:
        raise ImproperlyConfiguredEnv(name, f"expected redis://host:port/db, got {value!r}")
    try:
        parsed.port
    except ValueError:
        raise ImproperlyConfiguredEnv(name, "the port is not a number") from None
    return value
