"""Sign-up: an inactive account awaiting its e-mail confirmation, a signed expiring link to confirm it, and the link
sent again on request. Usernames and e-mail addresses are unique, e-mail addresses case-insensitively (also a
unique index on the table: marketplace/migrations)."""
from __future__ import annotations

import re

from django.conf import settings
from django.contrib.auth import get_user_model, password_validation
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from marketplace.models import AccountSecurity
from scheduler.errors import Conflict, DomainError

from .mail import send_after_commit

SALT = "gpumarket.accounts.confirm-email"
USERNAME = re.compile(r"^[\w.+-]{2,40}$")  # Django's characters less "@": a username never reads as an e-mail


def _username_checked(username: str) -> str:
    username = (username or "").strip()
    if not USERNAME.match(username):
        raise DomainError("a username is 2 to 40 letters, digits and . + - _ (no spaces, no @)", field="username")
    return username


def email_checked(email: str) -> str:
    """The address as typed, its domain lower-cased (the part before @ may be case-sensitive on its server)."""
    email = (email or "").strip()
    try:
        validate_email(email)
    except ValidationError:
        raise DomainError("enter an e-mail address like name@example.org", field="email") from None
    if len(email) > 254:
        raise DomainError("an e-mail address has at most 254 characters", field="email")
    return get_user_model().objects.normalize_email(email)


def email_taken(email: str) -> bool:
    return get_user_model().objects.filter(email__iexact=email).exists()


def account_sign_up(*, username: str, email: str, password: str, link_base: str):
    """Create an inactive account that awaits its e-mail confirmation, and send it the link (after commit).
    `link_base` is the site's scheme and host the link points at ("https://market.example.org")."""
    User = get_user_model()
    username, email = _username_checked(username), email_checked(email)
    try:
        password_validation.validate_password(password, User(username=username, email=email))
    except ValidationError as exc:
        raise DomainError(" ".join(exc.messages), field="password") from None
    if User.objects.filter(username__iexact=username).exists():
        raise Conflict("that username is taken: choose another", field="username")
    if email_taken(email):
        raise Conflict("an account with this e-mail address exists: log in, or reset its password", field="email")
    try:
        with transaction.atomic():
            user = User.objects.create_user(username, email, password, is_active=False)
            AccountSecurity.objects.create(user=user, signed_up_at=timezone.now())
            _send_link(user, link_base)
    except IntegrityError:  # the same username or e-mail signed up in the same instant (the indexes decide)
        raise Conflict("that username or e-mail address was just taken: choose another", field="email") from None
    return user


def confirmation_token(user) -> str:
    """A signed link token naming the account and the address it confirms; expires after CONFIRM_LINK_SECONDS."""
    return signing.dumps({"u": user.pk, "e": user.email.lower()}, salt=SALT, compress=True)


def _send_link(user, link_base: str) -> None:
    link = link_base.rstrip("/") + reverse("confirm-email", args=[confirmation_token(user)])
    hours = settings.ACCOUNTS["CONFIRM_LINK_SECONDS"] // 3600
    send_after_commit(template="confirm", to=user.email,
                      context={"user": user, "link": link, "valid": f"{hours} hours" if hours else "an hour"})


def email_confirm(*, token: str):
    """Confirm the address a link names and activate its account; returns (user, whether it was confirmed now).
    A link of an address the account no longer has, a forged or an expired one is refused."""
    try:
        data = signing.loads(token, salt=SALT, max_age=settings.ACCOUNTS["CONFIRM_LINK_SECONDS"])
    except signing.SignatureExpired:
        raise DomainError("this link has expired: ask for a new one below", code="link_expired") from None
    except (signing.BadSignature, ValueError):
        raise DomainError("this link is not valid: copy the whole link from the e-mail, or ask for a new one below",
                          code="link_invalid") from None
    with transaction.atomic():
        # Locked: two clicks on the link (or a mail scanner and the user) confirm once.
        row = (AccountSecurity.objects.select_for_update().select_related("user")
               .filter(user_id=data.get("u")).first())
        if row is None or row.user.email.lower() != data.get("e"):
            raise DomainError("this link is not valid: copy the whole link from the e-mail, or ask for a new one "
                              "below", code="link_invalid")
        if row.email_confirmed_at is not None:
            return row.user, False
        row.email_confirmed_at = timezone.now()
        row.save(update_fields=["email_confirmed_at"])
        get_user_model().objects.filter(pk=row.user_id).update(is_active=True)
        row.user.is_active = True
    return row.user, True


def confirmation_resend(*, email: str, link_base: str) -> None:
    """Send a new link to the account with this address if it awaits confirmation. Says nothing either way, so the
    form does not tell who has an account."""
    email = email_checked(email)
    row = (AccountSecurity.objects.select_related("user")
           .filter(user__email__iexact=email, signed_up_at__isnull=False, email_confirmed_at__isnull=True).first())
    if row is not None:
        _send_link(row.user, link_base)


def awaiting_confirmation(user) -> bool:
    return AccountSecurity.objects.filter(user_id=user.pk, signed_up_at__isnull=False,
                                          email_confirmed_at__isnull=True).exists()
