"""POST /stripe/webhook/: Stripe's events, signature-verified; no session, no CSRF, no API key."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from marketplace.products.payments import webhook_receive
from scheduler.errors import DomainError


@csrf_exempt  # Stripe cannot send a CSRF token; the HMAC signature authenticates the request instead
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    try:
        event = webhook_receive(payload=request.body, signature=request.headers.get("Stripe-Signature"))
    except DomainError as exc:
        return JsonResponse({"error": {"code": exc.code, "message": exc.message}}, status=exc.status)
    return JsonResponse({"received": event.event_id, "processed": event.processed})
