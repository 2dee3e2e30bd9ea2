"""What an API key may do through the REST API: its scopes, checked on every API view (the default permission in
settings.REST_FRAMEWORK).

A session (the console, a browser on /api/docs/) may do all its user may. A key: safe methods need `read`; a write
needs the scope its view names in `write_scope`: `trade` for the market and money (orders, leases, bids, resale,
top-ups, refunds, projects, SSH keys), `provide` for the fleet (nodes, GPUs, slices) and payouts. A view that names
no write scope takes no writes from keys (fail closed). A missing scope is a 403 whose code is `missing_scope` and
whose details name it."""
from __future__ import annotations

from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import SAFE_METHODS, IsAuthenticated

from marketplace.models import ApiKey

# `write_scope` of a view whose writes the service checks against the key itself (API keys: a key makes and
# revokes only keys within its own scopes).
WITHIN_OWN_SCOPES = "within_own_scopes"


class MissingScope(PermissionDenied):
    default_code = "missing_scope"

    def __init__(self, scope: str, message: str | None = None):
        super().__init__(message or f"this API key lacks the {scope!r} scope this request needs; make a key with it "
                                    f"(console: Account, API keys)")
        self.details = {"scope": scope}


def required_scope(request, view) -> str | None:
    return "read" if request.method in SAFE_METHODS else getattr(view, "write_scope", None)


class KeyScopes(IsAuthenticated):
    """Signed in (a session or a key), and a key holds the scope the request needs."""

    def has_permission(self, request, view) -> bool:
        if not super().has_permission(request, view):
            return False
        key = request.auth
        if not isinstance(key, ApiKey):
            return True  # a session: everything its user may do
        scope = required_scope(request, view)
        if scope is None:
            raise PermissionDenied("API keys cannot do this; it is done in the console")
        if scope != WITHIN_OWN_SCOPES and scope not in key.scopes:
            raise MissingScope(scope)
        return True
