"""The OpenAPI schema is the API's contract (GET /api/schema/): what each view declares, plus what every view
shares, added here once: the error responses each operation can give (in the one error shape), and the two
security schemes (an API key as a Bearer token, the console's session cookie).

Which errors an operation can give follows from what it is: 401 (no or a bad API key), 429 (throttled) and 503
(the database busy) anywhere; 403 (a missing scope, a session write without its CSRF token) unless it is public;
404 with a path parameter; 400 and 415 on writes, and 400 where a query parameter or body can be malformed.
What else an action can answer (409 a conflict, 402 money, 502 the payment provider) its view declares in
`error_statuses = {action: (409, ...)}`."""
from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from marketplace.products.apikeys import SCOPES

ERRORS_SAID = {
    400: "invalid input: `fields` names each culprit (a body that is not one JSON object, a bad query parameter)",
    401: "no credentials, or an API key that is unknown or revoked",
    402: "not enough money in the wallet",
    403: "not allowed: an API key without the scope this needs (`details.scope`), or a session write without its "
         "CSRF token",
    404: "not found, or not yours",
    409: "a conflict with the current state (the code says which)",
    502: "the payment provider could not be reached or refused the request: nothing was charged",
    415: "a write whose body is not JSON",
    429: "too many requests: wait `Retry-After` seconds",
    503: "the service is busy or its database unreachable: nothing was done; retry after `Retry-After` seconds",
}
RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds to wait before retrying"}}
UNSAFE = ("POST", "PUT", "PATCH", "DELETE")


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="machine-readable: invalid, not_found, missing_scope, unavailable, ...")
    message = serializers.CharField(help_text="what went wrong, for a person")
    fields = serializers.DictField(required=False, help_text="invalid input: each culprit field's messages")
    details = serializers.DictField(required=False, help_text="more facts, e.g. the missing `scope`, the `reasons` "
                                                              "an order could not be placed")


class ErrorSerializer(serializers.Serializer):
    """Every error of the API has this shape."""

    error = ErrorDetailSerializer()


class ApiSchema(AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation["responses"]
        for status in self._error_statuses(operation):
            if str(status) not in responses:
                responses[str(status)] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description=ERRORS_SAID[status]), str(status),
                    media_types=["application/json"])
            if status in (429, 503):
                responses[str(status)]["headers"] = RETRY_AFTER
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def _error_statuses(self, operation: dict) -> set[int]:
        statuses = {401, 429, 503}
        public = {} in operation.get("security", [])
        if not public:
            statuses.add(403)
        parameters = operation.get("parameters", [])
        if any(p["in"] == "path" for p in parameters):
            statuses.add(404)
        if self.method in UNSAFE:
            statuses |= {400, 415}
        if "requestBody" in operation or any(p["in"] == "query" for p in parameters):
            statuses.add(400)
        action = getattr(self.view, "action", None) or self.method.lower()
        return statuses | set(getattr(self.view, "error_statuses", {}).get(action, ()))


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "marketplace.api.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "gpm_key_...",
                "description": f"An API key: `Authorization: Bearer gpm_key_...`. Its scopes ({', '.join(SCOPES)}) "
                               f"say what it may do: `read` for GET, `trade` for market and money writes, `provide` "
                               f"for fleet writes (docs/api.md)."}
