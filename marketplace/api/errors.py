"""One JSON error shape for the whole API: {"error": {"code", "message", "fields"?, "details"?}}."""
from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from django.db import OperationalError
from django.http import Http404
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from scheduler.errors import DomainError


def _flatten(detail) -> str:
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_flatten(v)}" for k, v in detail.items())
    if isinstance(detail, list):
        return " ".join(_flatten(v) for v in detail)
    return str(detail)


RETRY_AFTER_SECONDS = 2


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField(help_text="machine-readable, e.g. invalid, not_found, exceeds_payable")
    message = serializers.CharField(help_text="what went wrong, in words a user can act on")
    fields = serializers.DictField(child=serializers.ListField(child=serializers.CharField()), required=False,
                                   help_text="the messages of each field at fault")
    details = serializers.DictField(required=False, help_text="facts that go with the error")


class ErrorSerializer(serializers.Serializer):
    """The one error shape of the API (for the OpenAPI schema)."""

    error = ErrorBodySerializer()


def exception_handler(exc, context):
    if isinstance(exc, DomainError):
        body = {"code": exc.code, "message": exc.message}
        if exc.field:
            body["fields"] = {exc.field: [exc.message]}
        if exc.details:
            body["details"] = exc.details
        return Response({"error": body}, status=exc.status)
    if isinstance(exc, OperationalError):
        # The database is busy or away (no pooled connection free within DB_POOL_TIMEOUT, a connection killed,
        # a server restarting): the request did not happen, and the same request a moment later may.
        return Response({"error": {"code": "service_unavailable",
                                   "message": "the service is busy or its database is unreachable; retry shortly"}},
                        status=status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if isinstance(exc, (Http404, ObjectDoesNotExist)):
        return Response({"error": {"code": "not_found", "message": "not found"}}, status=status.HTTP_404_NOT_FOUND)
    response = drf_handler(exc, context)
    if response is None:
        return None
    code = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        response.data = {"error": {"code": "invalid", "message": _flatten(exc.detail), "fields": fields}}
    else:
        response.data = {"error": {"code": code if isinstance(code, str) else "error", "message": _flatten(response.data.get("detail", response.data))}}
    return response

