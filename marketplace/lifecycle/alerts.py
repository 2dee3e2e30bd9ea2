"""Raise and resolve alerts, de-duplicated: the one way any part of the market tells a user something needs their
attention (docs/operations.md "Alerts"). Below the products so that every product can call it.

`alert_fire` opens an alert for (user, subject_key) unless one is firing already (then it only refreshes the text:
no second bell, e-mail or webhook); `alert_resolve` closes the firing one, if any. Delivery happens after commit:
the console's bell (the user's sockets), the account's webhook (NotificationSettings kind "alerts", the SSRF rules
of notifications.py) and, on firing only, an e-mail to the account's address."""
from __future__ import annotations

import logging
from datetime import datetime

from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.utils import timezone

from marketplace import events
from marketplace.models import Alert, AlertKind

log = logging.getLogger(__name__)

WEBHOOK_KIND = "alerts"


def alert_event(alert: Alert) -> dict:
    """The alert as the bell's socket and the webhook receive it."""
    return {"type": f"alert_{alert.state}", "alert": {
        "id": alert.pk, "kind": alert.kind, "subject": alert.subject_key, "state": alert.state,
        "severity": alert.severity, "title": alert.title, "detail": alert.detail, "suggestion": alert.suggestion,
        "lease": str(alert.lease_id) if alert.lease_id else None, "project": alert.project_id,
        "fired_at": alert.fired_at.isoformat(),
        "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None}}


def _announce(alert: Alert) -> None:
    event = alert_event(alert)
    events.tell_buyer(alert.user_id, event)
    events.notify_webhook(user_id=alert.user_id, kind=WEBHOOK_KIND, payload=event)


def _mail_after_commit(alert: Alert) -> None:
    if alert.user.email:
        text = render_to_string("alerts/email/alert.txt", {"alert": alert, "user": alert.user})
        subject, _, body = text.strip().partition("\n")
        events.mail_later(to=alert.user.email, subject=subject.strip(), body=body)


def alert_fire(*, user, kind: str, subject_key: str, title: str, detail: str = "", severity: str = "warning",
               suggestion: dict | None = None, lease=None, project=None, email: bool = True,
               now: datetime | None = None) -> tuple[Alert, bool]:
    """The firing alert for (user, subject_key), and whether this call opened it (and so announced it). One firing
    alert per subject, guaranteed by the database: two callers racing open one, the other gets it back."""
    if kind not in AlertKind.values:
        raise ValueError(f"unknown alert kind {kind!r}")
    subject_key = subject_key[:200]  # the column's length: the lookups below must use the key as stored
    now = now or timezone.now()
    fields = {"title": title[:200], "detail": detail, "severity": severity, "suggestion": suggestion}
    with transaction.atomic():
        firing = Alert.objects.select_for_update().filter(user=user, subject_key=subject_key,
                                                           state=Alert.State.FIRING).first()
        if firing is None:
            try:
                with transaction.atomic():  # a savepoint: the unique constraint settles a race with another firer
                    alert = Alert.objects.create(user=user, kind=kind, subject_key=subject_key, fired_at=now,
                                                 lease=lease, project=project, **fields)
            except IntegrityError:
                firing = Alert.objects.select_for_update().get(user=user, subject_key=subject_key,
                                                               state=Alert.State.FIRING)
            else:
                _announce(alert)
                if email:
                    _mail_after_commit(alert)
                return alert, True
        changed = [f for f, v in fields.items() if getattr(firing, f) != v]
        if changed:  # the numbers moved (spend, runway): the list shows the latest; no new delivery
            for f in changed:
                setattr(firing, f, fields[f])
            firing.save(update_fields=changed)
        return firing, False


def alert_resolve(*, user, subject_key: str, now: datetime | None = None) -> Alert | None:
    """Resolve the firing alert for (user, subject_key), announcing it; None when none was firing."""
    now = now or timezone.now()
    with transaction.atomic():
        # Compare-and-set on the state: two resolvers (two beats, a user's click) resolve and announce it once.
        alert = Alert.objects.select_for_update().filter(user=user, subject_key=subject_key,
                                                          state=Alert.State.FIRING).first()
        if alert is None:
            return None
        alert.state, alert.resolved_at = Alert.State.RESOLVED, now
        alert.save(update_fields=["state", "resolved_at"])
        _announce(alert)
    return alert


def alerts_firing(*, user_id, kind: str | None = None, prefix: str = "") -> dict[str, Alert]:
    """The user's firing alerts (of `kind`, whose subject starts with `prefix`) by subject key."""
    qs = Alert.objects.filter(user_id=user_id, state=Alert.State.FIRING, subject_key__startswith=prefix)
    if kind:
        qs = qs.filter(kind=kind)
    return {a.subject_key: a for a in qs}
