"""One JSON error shape for the whole API: {"error": {"code", "message", "fields"?, "details"?}}.

Everything under /api/ answers in it: DRF's exceptions and the domain's (exception_handler), an exception nobody
expected (a 500 that is logged, never Django's HTML page), an unknown path or a missing trailing slash with any
method (api_not_found: no CSRF page for a script's POST), and Django's own 400/403/404/500 handlers and its CSRF
failure when the path is an API path (json_error, called by marketplace/views/errors.py)."""
from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, SuspiciousOperation
from django.db import OperationalError
from django.http import Http404, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from scheduler.errors import DomainError

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 2
SERVER_ERROR_MESSAGE = "something went wrong on our side; it was logged. Retry later, or tell the operator"


def error_body(code: str, message: str, *, fields: dict | None = None, details: dict | None = None) -> dict:
    """The one error shape."""
    body = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    if details:
        body["details"] = details
    return {"error": body}


def is_api_path(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def json_error(status_code: int, code: str, message: str, **kw) -> JsonResponse:
    return JsonResponse(error_body(code, message, **kw), status=status_code)


def _flatten(detail) -> str:
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_flatten(v)}" for k, v in detail.items())
    if isinstance(detail, list):
        return " ".join(_flatten(v) for v in detail)
    return str(detail)


def exception_handler(exc, context):
    response = _error_response(exc, context)
    request = context.get("request")
    renderer = getattr(request, "accepted_renderer", None)
    if response is not None and renderer is not None and renderer.format != "json":
        # A request for another format (?format=csv) still gets its error as JSON.
        request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
    return response


def _error_response(exc, context):
    if isinstance(exc, DomainError):
        return Response(error_body(exc.code, exc.message, fields={exc.field: [exc.message]} if exc.field else None,
                                   details=exc.details or None), status=exc.status)
    if isinstance(exc, OperationalError):
        # The database is busy or away (no pooled connection free within DB_POOL_TIMEOUT, a connection killed,
        # a server restarting): the request did not happen, and the same request a moment later may.
        return Response(error_body("service_unavailable",
                                   "the service is busy or its database is unreachable; retry shortly"),
                        status=status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if isinstance(exc, (Http404, ObjectDoesNotExist)):
        return Response(error_body("not_found", "not found"), status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, SuspiciousOperation):  # Django's refusal of a malformed request (a header, a path)
        return Response(error_body("bad_request", "the request could not be understood"),
                        status=status.HTTP_400_BAD_REQUEST)
    response = drf_handler(exc, context)
    if response is None:
        if settings.DEBUG:
            return None  # a developer's DEBUG run: Django's technical page with the traceback
        view = context.get("view")
        log.error("unhandled error in %s", type(view).__name__ if view else "an API view", exc_info=exc)
        return Response(error_body("server_error", SERVER_ERROR_MESSAGE), status=status.HTTP_500_INTERNAL_SERVER_ERROR)
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        response.data = error_body("invalid", _flatten(exc.detail), fields=fields)
        return response
    code = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
    details = getattr(exc, "details", None)
    response.data = error_body(code if isinstance(code, str) else "error",
                               _flatten(response.data.get("detail", response.data)), details=details)
    return response


def _route_with_slash(path: str) -> str | None:
    """`path` + "/" when that is an endpoint of the API (a script forgot the trailing slash)."""
    if path.endswith("/"):
        return None
    try:
        match = resolve(path + "/")
    except Resolver404:
        return None
    return None if match.func is api_not_found else path + "/"


@csrf_exempt  # it changes nothing; without this a script's POST to a wrong path got Django's HTML CSRF page
def api_not_found(request, *args, **kwargs) -> JsonResponse:
    """Any method on a path the API does not have: a 404 in the one shape, naming the path with the slash when
    that is what was meant."""
    meant = _route_with_slash(request.path)
    if meant:
        return json_error(404, "not_found", f"no API endpoint at {request.path}; API paths end with a slash: "
                                            f"{meant}", details={"did_you_mean": meant})
    return json_error(404, "not_found", f"no API endpoint at {request.path}; see /api/docs/")
