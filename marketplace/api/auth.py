"""`Authorization: Bearer gpm_key_...` authentication for scripts: on the REST API (DRF) and on the console's
websocket (a script subscribes to metrics and market events with a key that has the `read` scope).

Invalid keys count against the client's address (marketplace/products/accounts/throttle.py): past the limit the
address gets 429 with Retry-After, in the API's one error shape, before any key is looked up."""
from channels.db import database_sync_to_async
from rest_framework import authentication, exceptions

from marketplace.products.accounts import logins
from marketplace.products.accounts.throttle import client_address, scope_address
from marketplace.products.apikeys import api_key_resolve


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """`request.user` is the key's user and `request.auth` the key (with its scopes)."""

    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if len(parts) != 2 or parts[0].lower() != self.keyword:
            raise exceptions.AuthenticationFailed("use the header 'Authorization: Bearer <api key>'")
        address = client_address(request)
        refusal = logins.api_key_refusal(address=address)
        if refusal is not None:
            throttled = exceptions.Throttled(wait=refusal.retry_after)  # Retry-After
            throttled.detail = exceptions.ErrorDetail(refusal.message, code="throttled")
            raise throttled
        key = api_key_resolve(secret=parts[1])
        if key is None:
            logins.api_key_failed(address=address)
            raise exceptions.AuthenticationFailed("unknown or revoked API key")
        return key.user, key

    def authenticate_header(self, request):
        return "Bearer"


def bearer_secret(scope) -> str | None:
    """The key of a websocket handshake's `Authorization: Bearer ...` header, "" for a malformed header, or None
    where the handshake has no such header (a browser: it rides the session)."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            parts = value.decode("latin-1").split()
            return parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else ""
    return None


class ApiKeyWebsocketAuth:
    """Websocket handshakes that carry an API key: `scope["user"]` is its user when the key is active and has the
    `read` scope, else the anonymous user (the consumer then closes with 4401). Scripts send no Origin, so this
    path has no origin check: a browser cannot set the header, and a key is not a cookie it sends by itself."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        from django.contrib.auth.models import AnonymousUser

        key = await database_sync_to_async(_resolve)(secret=bearer_secret(scope), address=scope_address(scope))
        user = key.user if key is not None and "read" in key.scopes else AnonymousUser()
        return await self.inner(dict(scope, user=user, api_key=key), receive, send)


def _resolve(*, secret: str | None, address: str):
    """The key of a handshake, counting an invalid one against the address; None (without a look-up) while the
    address is throttled."""
    if secret is None:
        return None
    if logins.api_key_refusal(address=address) is not None:
        return None
    key = api_key_resolve(secret=secret)
    if key is None:
        logins.api_key_failed(address=address)
    return key
