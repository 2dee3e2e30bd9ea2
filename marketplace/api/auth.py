"""`Authorization: Bearer gpm_key_...` authentication for scripts."""
from rest_framework import authentication, exceptions

from marketplace.products.apikeys import api_key_user


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if len(parts) != 2 or parts[0].lower() != self.keyword:
            raise exceptions.AuthenticationFailed("use the header 'Authorization: Bearer <api key>'")
        user = api_key_user(secret=parts[1])
        if user is None:
            raise exceptions.AuthenticationFailed("unknown or revoked API key")
        return user, None

    def authenticate_header(self, request):
        return "Bearer"
