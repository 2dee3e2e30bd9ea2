"""JSON-only writes, on every API view (settings.REST_FRAMEWORK): a body is one JSON object, and a write with any
other body is a 415 before its handler runs, so nothing is written.

DRF alone only refuses a body when a view reads `request.data`; an action such as `leases/{id}/end/` never does,
and would act on a form-encoded POST. And DRF's JSON parser takes any JSON value: a list or a number sent to an
action that reads `request.data.get(...)` was a 500."""
from __future__ import annotations

from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.parsers import JSONParser
from rest_framework.permissions import SAFE_METHODS, BasePermission

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false",
              type(None): "null"}


class JSONObjectParser(JSONParser):
    """The API's one parser: a JSON object, or a 400 in the one error shape."""

    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        if not isinstance(data, dict):
            raise ParseError(f"the body is a JSON object ({{...}}), not {JSON_KINDS.get(type(data), 'that')}")
        return data


def require_json(request) -> None:
    """Raise 415 when a write carries a body (or a form content type) that is not JSON."""
    media_type = (request.content_type or "").split(";")[0].strip().lower()
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    has_body = length > 0 or "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
    is_json = media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))
    if (has_body and not is_json) or media_type in FORM_TYPES:
        raise UnsupportedMediaType(media_type or "none",
                                   detail=f"writes take JSON only (Content-Type: application/json), "
                                          f"not {media_type or 'a body without a content type'}")


class JsonOnlyWrites(BasePermission):
    """Last of the default permissions, so authentication and scopes answer first: a write whose body is not
    JSON is a 415."""

    def has_permission(self, request, view):
        if request.method not in SAFE_METHODS:
            require_json(request)
        return True
