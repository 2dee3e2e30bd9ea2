"""The account e-mails (confirmation link, lock-out notice): rendered from templates/accounts/email/, sent through
Django's e-mail backend once the transaction that decided to send them has committed."""
from __future__ import annotations

from django.conf import settings
from django.template.loader import render_to_string

from marketplace import events


def send_after_commit(*, template: str, to: str, context: dict) -> None:
    """Send `accounts/email/<template>.txt` (its first line is the subject) to `to` after commit. A mail server
    that refuses is logged, not raised: the account's change stands and the user can ask for the mail again."""
    text = render_to_string(f"accounts/email/{template}.txt", context)
    subject, _, body = text.strip().partition("\n")
    events.mail_later(to=to, subject=subject.strip(), body=body)


def where_unsent_mail_goes() -> str | None:
    """Where e-mail goes when this server does not send it (the demo's file or console backend), so that a person
    can still follow a link; None when it is sent."""
    if settings.EMAIL_BACKEND.endswith("filebased.EmailBackend"):
        return f"each message is written as a file under {settings.EMAIL_FILE_PATH}/"
    if settings.EMAIL_BACKEND.endswith("console.EmailBackend"):
        return "each message is printed in the web process's output"
    return None
