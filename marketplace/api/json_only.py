"""JSON-only writes: every API view that changes something refuses a non-JSON body with a 415, before its
handler runs, so nothing is written. DRF alone only refuses a body when a view reads `request.data`; an
action such as `leases/{id}/end/` never does, and would act on a form-encoded POST."""
from __future__ import annotations

from rest_framework.exceptions import UnsupportedMediaType
from rest_framework.parsers import JSONParser
from rest_framework.permissions import SAFE_METHODS

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


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


class JsonWrites:
    """Mix into an API view: JSON is the only parser, and a write with any other body is a 415."""

    parser_classes = [JSONParser]

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)  # authentication, permissions and throttles answer first
        if request.method not in SAFE_METHODS:
            require_json(request)
