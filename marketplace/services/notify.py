"""Side effects of market changes, always after commit: the buyer's sockets, the buyer's webhook and the
agent of the node (a `notice` command, itself sent after commit by command_issue)."""
from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

from django.conf import settings
from django.db import transaction

from scheduler.services.events import announce_buyer

log = logging.getLogger(__name__)


def tell_buyer(user_id, event: dict) -> None:
    """Push `event` to the user's console sockets once the surrounding transaction commits."""
    transaction.on_commit(lambda: announce_buyer(user_id, event))


def webhook_later(url: str, payload: dict) -> None:
    """POST `payload` to the buyer's webhook from a Celery task once the transaction commits."""
    if not url:
        return
    from marketplace.tasks import deliver_webhook

    transaction.on_commit(lambda: deliver_webhook.delay(url, payload))


def notify_webhook(*, user_id, kind: str, payload: dict, order_webhook: str = "") -> None:
    """POST a market event of `kind` after commit to the order's own webhook, else the account's (if on)."""
    from .notifications import webhook_for

    webhook_later(webhook_for(user_id=user_id, kind=kind, order_webhook=order_webhook), payload)


def webhook_post(*, url: str, payload: dict, timeout: float | None = None) -> bool:
    """One POST with a short timeout; failures are logged, never raised (the socket and agent still know).
    The host's addresses are checked again here: a name may resolve to a private address (SSRF)."""
    from scheduler.errors import DomainError

    from .notifications import webhook_url_check

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
