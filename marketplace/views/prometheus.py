"""GET /metrics for Prometheus: the text exposition format, behind a bearer token (settings.METRICS_TOKEN).

Prometheus sends the token with `authorization: {credentials: ...}` in its scrape config (docs/operations.md).
The endpoint is off (404) until a token is set: it shows the whole fleet's hostnames and the market's volumes."""
from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from marketplace.api.errors import error_body
from marketplace.products.prometheus import metrics_registry


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.METRICS_TOKEN
    if not token:
        return JsonResponse(error_body("not_found", "metrics are off here: the operator sets METRICS_TOKEN to turn "
                                       "them on"), status=404)
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        response = JsonResponse(error_body("not_authenticated", "send the metrics token as "
                                           "'Authorization: Bearer <token>'"), status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)
