"""What the market announces, always after commit: the buyer's console sockets, the buyer's webhook (a
Celery task, called by name: nothing below the interfaces imports tasks.py). The agent of a node hears
through fleet commands (scheduler.services.commands), which are sent after commit too."""
from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction

from config.celery import run_task
from scheduler.errors import DomainError
from scheduler.services.events import announce_buyer, announce_lease

from .notifications import webhook_for, webhook_url_check

log = logging.getLogger(__name__)

DELIVER_WEBHOOK = "market.deliver_webhook"


def tell_buyer(user_id, event: dict) -> None:
    """Push `event` to the user's console sockets once the surrounding transaction commits."""
    transaction.on_commit(lambda: announce_buyer(user_id, event))


def tell_lease_watchers(lease_id, event: dict) -> None:
    """Push `event` to the console sockets watching the lease (its page) once the transaction commits."""
    transaction.on_commit(lambda: announce_lease(lease_id, event))


def webhook_later(url: str, payload: dict) -> None:
    """POST `payload` to `url` from a Celery task once the transaction commits."""
    if url:
        transaction.on_commit(lambda: run_task(DELIVER_WEBHOOK, url, payload))


def notify_webhook(*, user_id, kind: str, payload: dict, order_webhook: str = "") -> None:
    """POST a market event of `kind` after commit to the order's own webhook, else the account's (if on)."""
    webhook_later(webhook_for(user_id=user_id, kind=kind, order_webhook=order_webhook), payload)


def mail_later(*, to: str, subject: str, body: str) -> None:
    """Send an e-mail through Django's e-mail backend once the transaction commits. A mail server that refuses is
    logged, not raised: what decided to send it stands."""
    def send() -> None:
        try:
            send_mail(subject, body.strip() + "\n", settings.DEFAULT_FROM_EMAIL, [to])
        except Exception:  # noqa: BLE001 (any backend's failure: SMTP refused, timeout, disk full)
            log.exception("could not send the e-mail %r to %s", subject, to)

    transaction.on_commit(send)


def webhook_post(*, url: str, payload: dict, timeout: float | None = None) -> bool:
    """One POST with a short timeout; failures are logged, never raised (the socket and agent still know).
    The host's addresses are checked again here: a name may resolve to a private address (SSRF)."""
    try:
        webhook_url_check(url, resolve=True)
    except DomainError as exc:
        log.warning("webhook %s refused: %s", url, exc.message)
        return False
    body = json.dumps(payload).encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "gpumarket-webhook/1"})
    try:
        with urllib.request.urlopen(req, timeout=timeout or settings.MARKET["WEBHOOK_TIMEOUT_SECONDS"]) as resp:
            ok = 200 <= resp.status < 300
            if not ok:
                log.warning("webhook %s answered %s", url, resp.status)
            return ok
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log.warning("webhook %s failed: %s", url, exc)
        return False
