"""The one authentication backend of the console and the admin (the admin logs in through the console's page): a
username or an e-mail address with its password, refused whatever the password while the client's address is
throttled or the account locked (docs/accounts.md). Failures count against both.

Django's authenticate() turns the PermissionDenied raised here into a failed log-in; the reason is left on the
request (`request.login_refusal`) for the log-in form to say."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied

from marketplace.products.accounts import logins
from marketplace.products.accounts.throttle import client_address


def _refuse(request, refusal: logins.Refusal):
    if request is not None:
        request.login_refusal = refusal
    raise PermissionDenied(refusal.message)


class AccountBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if not username or password is None:
            return None
        address = client_address(request) if request is not None else "local"
        user = logins.account_for_login(identifier=username)
        refusal = logins.refusal_before_password(user=user, address=address)
        if refusal:
            _refuse(request, refusal)
        if user is None:
            get_user_model()().set_password(password)  # as slow as a wrong password: no hint that the name is free
            logins.login_failed(user=None, address=address)
            return None
        if not user.check_password(password):
            refusal = logins.login_failed(user=user, address=address)
            if refusal:
                _refuse(request, refusal)
            return None
        refusal = logins.refusal_after_password(user=user)
        if refusal:
            _refuse(request, refusal)
        return user if self.user_can_authenticate(user) else None
