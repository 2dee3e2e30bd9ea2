"""Log-in checks around the password (and the second factor): the per-address throttle, the per-account lock-out
(kept in the database, so every web process sees it and it holds while Redis is away) and its e-mail."""
from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marketplace.models import AccountSecurity

from . import throttle
from .mail import send_after_commit
from .policy import LockoutPolicy, LockState, after_failure, in_words, wait_seconds
from .signup import awaiting_confirmation


@dataclass(frozen=True)
class Refusal:
    """Why a log-in is refused whatever the password: `throttled` (this address), `locked` (this account),
    `unconfirmed` (the account's e-mail is not confirmed yet; said only after a right password)."""

    code: str
    message: str
    retry_after: int = 0


def account_for_login(*, identifier: str):
    """The account a log-in names: by username, else by e-mail address (case-insensitive); None if neither."""
    identifier = (identifier or "").strip()
    if not identifier or len(identifier) > 254:
        return None
    User = get_user_model()
    user = User.objects.filter(username=identifier).first()
    if user is None and "@" in identifier:
        user = User.objects.filter(email__iexact=identifier).first()
    return user


def _policy() -> LockoutPolicy:
    return LockoutPolicy.from_settings(settings.ACCOUNTS)


def _locked(row: AccountSecurity) -> Refusal:
    wait = wait_seconds(row.locked_until, timezone.now())
    policy = _policy()
    return Refusal("locked", f"This account is locked for {in_words(wait)} after {policy.failures} failed log-ins "
                             f"(until {row.locked_until:%H:%M} UTC); its owner was sent an e-mail. Forgot the "
                             f"password? Reset it: that unlocks the account.", wait)


def refusal_before_password(*, user, address: str) -> Refusal | None:
    """A refusal that stands before any password is checked: the address throttled, or the account locked."""
    wait = throttle.login_failures().wait(address=address)
    if wait:
        return Refusal("throttled", f"Too many failed log-ins from your network address: try again in "
                                    f"{in_words(wait)}.", wait)
    if user is not None:
        row = AccountSecurity.objects.filter(user_id=user.pk, locked_until__gt=timezone.now()).first()
        if row is not None:
            return _locked(row)
    return None


def refusal_after_password(*, user) -> Refusal | None:
    """The right password of an account that has not confirmed its e-mail yet."""
    if not user.is_active and awaiting_confirmation(user):
        return Refusal("unconfirmed", f"Confirm your e-mail address first: follow the link we sent to "
                                      f"{masked(user.email)}, or have a new one sent.")
    return None


def masked(email: str) -> str:
    """a…@example.org: enough for its owner to recognise, little for anyone else."""
    local, _, domain = email.partition("@")
    return f"{local[:1]}…@{domain}" if domain else "your address"


def login_failed(*, user, address: str) -> Refusal | None:
    """Count a failed log-in (wrong password or code) against the address and, when it names an account, against
    the account; returns the refusal when this failure locked the account (its owner is e-mailed, once)."""
    throttle.login_failures().hit(address=address)
    if user is None:
        return None
    now = timezone.now()
    with transaction.atomic():
        # The row is locked: forty wrong passwords at once from several web processes count forty, and exactly one
        # of them locks the account and sends the e-mail.
        row, _ = AccountSecurity.objects.select_for_update().get_or_create(user_id=user.pk)
        state, locked_now = after_failure(LockState(row.failures, row.failures_since, row.locked_until), now=now,
                                          policy=_policy())
        row.failures, row.failures_since, row.locked_until = state.failures, state.failures_since, state.locked_until
        row.last_failure_address = address[:64]
        row.save(update_fields=["failures", "failures_since", "locked_until", "last_failure_address"])
        if not locked_now:
            return None
        if user.email:
            send_after_commit(template="locked", to=user.email, context={
                "user": user, "failures": _policy().failures, "address": address, "at": now,
                "until": row.locked_until, "minutes": in_words(wait_seconds(row.locked_until, now))})
    return _locked(row)


def login_succeeded(*, user) -> None:
    """A log-in that passed every factor forgets the failures before it."""
    AccountSecurity.objects.filter(user_id=user.pk).filter(Q(failures__gt=0) | Q(failures_since__isnull=False)).update(
        failures=0, failures_since=None)


def lock_clear(*, user) -> None:
    """The owner proved it holds the account's mailbox (a password reset): the lock and the count go."""
    AccountSecurity.objects.filter(user_id=user.pk).update(failures=0, failures_since=None, locked_until=None)


def api_key_refusal(*, address: str) -> Refusal | None:
    wait = throttle.api_key_failures().wait(address=address)
    if wait:
        return Refusal("throttled", f"too many invalid API keys from your address: retry in {in_words(wait)}", wait)
    return None


def api_key_failed(*, address: str) -> None:
    throttle.api_key_failures().hit(address=address)


def mail_refusal(*, address: str) -> Refusal | None:
    """Too many e-mails asked for from this address (sign-ups, links sent again, password resets)."""
    wait = throttle.mails().wait(address=address)
    if wait:
        return Refusal("throttled", f"Too many e-mails asked for from your network address: try again in "
                                    f"{in_words(wait)}.", wait)
    return None


def mail_counted(*, address: str) -> None:
    throttle.mails().hit(address=address)
