"""The console socket, as scripts use it (docs/market.md, Live events): `Authorization: Bearer <key>` on the
handshake (the key needs the read scope), `{"subscribe": {"lease": ID}}`, then the lease's GPU metrics frames, its
container's output (`lease_log`) and the account's market events (`lease_ended`, ...)."""
from __future__ import annotations

import json
from urllib.parse import urlsplit

from .errors import AuthError, CliError, Unreachable

OPEN_TIMEOUT = 10.0
SUBSCRIBE_TIMEOUT = 10.0
LEASE_OVER = ("lease_ended", "lease_failed")


def socket_url(base_url: str) -> str:
    """ws(s)://host[:port][/prefix]/ws/console/ of an http(s) base URL."""
    parts = urlsplit(base_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}/ws/console/"


def new_output(tail: str, early: list[str]) -> list[str]:
    """The output chunks that arrived on the socket while the kept tail was being fetched, less those already at
    the tail's end: the server keeps a chunk before it sends it, so the ones in the tail are a prefix of `early`."""
    for k in range(len(early), 0, -1):
        if tail.endswith("".join(early[:k])):
            return early[k:]
    return early


class LeaseWatch:
    """A socket subscribed to one lease. `subscribed` is False when the server would not (the lease is over, or
    not yours): its error is in `refusal`."""

    def __init__(self, base_url: str, key: str, lease_id: str) -> None:
        self.url, self.key, self.lease_id = socket_url(base_url), key, lease_id
        self.ws = None
        self.subscribed = False
        self.refusal = ""
        self.early: list[dict] = []  # frames that came before the subscription's answer

    def __enter__(self) -> "LeaseWatch":
        from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI
        from websockets.sync.client import connect

        try:
            self.ws = connect(self.url, additional_headers={"Authorization": f"Bearer {self.key}"},
                              open_timeout=OPEN_TIMEOUT, user_agent_header="gpum")
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise AuthError("the live socket refused the key", hint="it needs the read scope (and must not be "
                                                                        "revoked)") from None
            raise CliError(f"the live socket answered HTTP {status}") from None
        except (InvalidURI, InvalidHandshake) as exc:
            raise Unreachable(f"cannot open the live socket {self.url}: {exc}") from None
        except (OSError, TimeoutError) as exc:
            raise Unreachable(f"cannot reach the live socket {self.url}: {exc}") from None
        self.ws.send(json.dumps({"subscribe": {"lease": self.lease_id}}))
        while True:
            frame = self.next(SUBSCRIBE_TIMEOUT)
            if frame is None:
                raise CliError("the live socket did not answer the subscription")
            if frame.get("type") == "subscribed" and frame.get("lease") == self.lease_id:
                self.subscribed = True
                return self
            if frame.get("type") == "error":
                self.refusal = frame.get("message", "")
                return self
            self.early.append(frame)

    def __exit__(self, *exc) -> None:
        if self.ws is not None:
            self.ws.close()

    def next(self, timeout: float | None) -> dict | None:
        """The next frame; None when `timeout` passed without one. A closed socket is an error."""
        from websockets.exceptions import ConnectionClosed

        try:
            text = self.ws.recv(timeout=timeout)
        except TimeoutError:
            return None
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else None
            if code == 4401:
                raise AuthError("the live socket closed: the key was refused (revoked?)") from None
            raise CliError(f"the live socket closed ({code or 'no code'})") from None
        try:
            frame = json.loads(text)
        except ValueError:
            return {}
        return frame if isinstance(frame, dict) else {}

    def pending(self) -> list[dict]:
        """The frames already received, without waiting."""
        out = []
        while (frame := self.next(0)) is not None:
            out.append(frame)
        return out

    def is_over(self, frame: dict) -> bool:
        """Whether `frame` says this lease ended or failed."""
        event = frame.get("event") or {}
        return frame.get("type") == "market" and event.get("type") in LEASE_OVER and \
            event.get("lease") == self.lease_id
