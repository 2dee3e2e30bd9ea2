"""The optional second factor: a TOTP authenticator app (RFC 6238, django-otp's TOTPDevice: replay of a used code
refused, a growing wait after wrong codes) and ten single-use recovery codes (django-otp's StaticDevice).

Turning it on takes two steps: `totp_begin` makes an unconfirmed device whose key the page shows (QR code and
otpauth:// URI), `totp_confirm` turns it on once a code from the app matches, and returns the recovery codes
(shown once). Turning it off, or making new recovery codes, takes a current code."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from scheduler.errors import Conflict, DomainError

from .policy import in_words, wait_seconds

RECOVERY_CODES = 10


def totp_enabled(user) -> bool:
    return TOTPDevice.objects.filter(user_id=user.pk, confirmed=True).exists()


def totp_pending(user) -> TOTPDevice | None:
    """The device being set up (its key shown, no code entered yet)."""
    return TOTPDevice.objects.filter(user_id=user.pk, confirmed=False).order_by("-id").first()


def recovery_codes_left(user) -> int:
    return StaticToken.objects.filter(device__user_id=user.pk, device__confirmed=True).count()


def totp_begin(*, user) -> TOTPDevice:
    """A new key for the authenticator app, not in force until `totp_confirm`."""
    if totp_enabled(user):
        raise Conflict("two-factor authentication is already on", field="code")
    with transaction.atomic():
        TOTPDevice.objects.filter(user_id=user.pk, confirmed=False).delete()
        return TOTPDevice.objects.create(user=user, name="authenticator app", confirmed=False)


def _normalised(code: str) -> str:
    return "".join((code or "").split()).replace("-", "").lower()


def _verified(device, code: str) -> bool:
    allowed, why = device.verify_is_allowed()
    if not allowed:
        wait = wait_seconds(why["locked_until"], timezone.now()) if why and why.get("locked_until") else 1
        raise DomainError(f"too many wrong codes: wait {in_words(max(wait, 1))} and enter the current one",
                          field="code", code="code_throttled")
    return device.verify_token(code)


def totp_confirm(*, user, code: str) -> list[str]:
    """Turn the second factor on when `code` matches the key being set up; returns the recovery codes."""
    with transaction.atomic():
        device = (TOTPDevice.objects.select_for_update().filter(user_id=user.pk, confirmed=False)
                  .order_by("-id").first())
        if device is None:
            raise DomainError("no set-up in progress: start again", field="code")
        matched = _verified(device, _normalised(code))
        if matched:
            device.confirmed = True
            device.save(update_fields=["confirmed"])
            codes = _recovery_codes_new(user)
    # Refused after the commit: the device's count of wrong codes (its growing wait) stays counted.
    if not matched:
        raise DomainError("that code does not match: enter the 6 digits your app shows now (check the phone's "
                          "clock if it keeps failing)", field="code")
    return codes


def _recovery_codes_new(user) -> list[str]:
    StaticDevice.objects.filter(user_id=user.pk).delete()
    device = StaticDevice.objects.create(user=user, name="recovery codes", confirmed=True)
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
    StaticToken.objects.bulk_create([StaticToken(device=device, token=c) for c in codes])
    return codes


def second_factor_check(*, user, code: str) -> bool:
    """Whether `code` is the current code of the account's app or one of its unused recovery codes (a recovery code
    is used up). Raises DomainError while too many wrong codes make it wait."""
    code = _normalised(code)
    if not code:
        return False
    with transaction.atomic():
        # Locked: the same code sent twice at once passes once (the device keeps the last step it accepted).
        if code.isdigit() and len(code) == 6:
            device = TOTPDevice.objects.select_for_update().filter(user_id=user.pk, confirmed=True).first()
        else:
            device = StaticDevice.objects.select_for_update().filter(user_id=user.pk, confirmed=True).first()
        return device is not None and _verified(device, code)


def totp_disable(*, user, code: str) -> None:
    """Turn the second factor off; needs a current code (or a recovery code)."""
    if not totp_enabled(user):
        raise DomainError("two-factor authentication is not on", field="code")
    if not second_factor_check(user=user, code=code):  # its own transaction: a wrong code stays counted
        raise DomainError("that code does not match: enter the current code of your app, or a recovery code",
                          field="code")
    with transaction.atomic():
        TOTPDevice.objects.filter(user_id=user.pk).delete()
        StaticDevice.objects.filter(user_id=user.pk).delete()


def recovery_codes_renew(*, user, code: str) -> list[str]:
    """New recovery codes (the old ones stop working); needs a current code."""
    if not totp_enabled(user):
        raise DomainError("two-factor authentication is not on", field="code")
    if not second_factor_check(user=user, code=code):
        raise DomainError("that code does not match: enter the current code of your app", field="code")
    with transaction.atomic():
        return _recovery_codes_new(user)
