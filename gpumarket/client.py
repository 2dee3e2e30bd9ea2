"""The REST API over urllib: the key on every request, the one error shape turned into exceptions with the exit
status they deserve, one polite retry when the server asks for it (429/503 with Retry-After), and pages followed."""
from __future__ import annotations

import email.utils
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timezone
from urllib.parse import parse_qsl, urlencode, urlsplit

from . import __version__
from .errors import ApiError, AuthError, Unreachable

API = "/api/v1"
RETRY_STATUSES = (429, 503)
MAX_RETRY_WAIT = 60.0  # a server asking for longer is answered with its error, not a minute's silence
PAGE = 200


def retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def error_from(status: int, raw: bytes, reason: str = "") -> ApiError:
    """The API's error shape as an ApiError; anything else (a proxy's HTML page) as its status and first line."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        fields = error.get("fields") if isinstance(error.get("fields"), dict) else None
        details = error.get("details") if isinstance(error.get("details"), dict) else None
        return ApiError(status, str(error.get("code") or "error"), error["message"], fields=fields,
                        details=details)
    first = raw.decode("utf-8", "replace").strip().splitlines()[:1]
    text = f"HTTP {status} {reason}".strip() + (f": {first[0][:200]}" if first else "")
    return ApiError(status, "http_error", text)


class Client:
    """One server and (maybe) one key. `sleep` and `warn` are injectable for tests."""

    def __init__(self, base_url: str, key: str | None, *, timeout: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep, warn: Callable[[str], None] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.timeout = timeout
        self.sleep = sleep
        self.warn = warn or (lambda text: print(text, file=sys.stderr))

    # --- requests --------------------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, params: dict | None = None, body: dict | None = None,
                headers: dict | None = None, auth: bool = True) -> object:
        """The response body: parsed JSON, or text for other content types (logs, CSV). Raises ApiError,
        AuthError (no key where one is needed) or Unreachable."""
        if auth and not self.key:
            raise AuthError("not logged in", hint="run `gpum login` (or set GPUM_API_KEY) with an API key from the "
                                                  "console's Account page")
        url = self.url(path, params)
        data = json.dumps(body).encode() if body is not None else None
        head = {"Accept": "application/json", "User-Agent": f"gpum/{__version__}", **(headers or {})}
        if data is not None:
            head["Content-Type"] = "application/json"
        if self.key:
            head["Authorization"] = f"Bearer {self.key}"
        for attempt in (1, 2):
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=head, method=method),
                                            timeout=self.timeout) as resp:
                    return _decode(resp.read(), resp.headers.get("Content-Type", ""))
            except urllib.error.HTTPError as err:
                raw = err.read()
                wait = retry_after(err.headers.get("Retry-After")) if err.code in RETRY_STATUSES else None
                if attempt == 1 and wait is not None and wait <= MAX_RETRY_WAIT:
                    self.warn(f"gpum: the server is busy ({err.code}); trying again in {wait:g} s")
                    self.sleep(wait)
                    continue
                raise error_from(err.code, raw, err.reason or "") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
                reason = getattr(err, "reason", err)
                raise Unreachable(f"cannot reach {self.base_url}: {reason}",
                                  hint="is the server running? check the URL (gpum login --url, GPUM_URL)") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def url(self, path: str, params: dict | None = None) -> str:
        if not path.startswith("/"):
            path = f"{API}/{path}"
        query = urlencode([(k, v) for k, v in (params or {}).items() if v is not None and v != ""], doseq=True)
        return f"{self.base_url}{path}" + (f"?{query}" if query else "")

    def get(self, path: str, params: dict | None = None, *, auth: bool = True, accept: str | None = None) -> object:
        return self.request("GET", path, params=params, auth=auth, headers={"Accept": accept} if accept else None)

    def post(self, path: str, body: dict | None = None, *, headers: dict | None = None) -> object:
        return self.request("POST", path, body=body, headers=headers)

    def delete(self, path: str) -> object:
        return self.request("DELETE", path)

    def all_pages(self, path: str, params: dict | None = None, *, auth: bool = True,
                  limit: int | None = None) -> list[dict]:
        return list(self.pages(path, params, auth=auth, limit=limit))

    def pages(self, path: str, params: dict | None = None, *, auth: bool = True,
              limit: int | None = None) -> Iterator[dict]:
        """Every object of a list endpoint, following its pages (`limit`: at most that many)."""
        query = {**(params or {}), "limit": min(PAGE, limit) if limit else PAGE}
        seen = 0
        while True:
            body = self.get(path, query, auth=auth)
            if isinstance(body, list):  # an unpaginated list (templates)
                yield from body[:limit] if limit else body
                return
            for item in body.get("results", []):
                yield item
                seen += 1
                if limit and seen >= limit:
                    return
            if not body.get("next"):
                return
            # The server's own `next` names its host as it saw it (a proxy may differ): only its query is taken.
            query = dict(parse_qsl(urlsplit(body["next"]).query))


def _decode(raw: bytes, content_type: str) -> object:
    if "json" in content_type or not content_type:
        try:
            return json.loads(raw or b"null")
        except ValueError:
            pass
    return raw.decode("utf-8", "replace")
