"""Provider payouts: a provider connects a payout account (Stripe Connect) and requests payouts of what is payable;
an operator approves or rejects each in the admin; an approved payout is transferred (connect.py) and becomes paid,
or failed with its money back in earnings. The state machine and the books are marketplace/money/payouts.py; this
module adds who may ask and the calls to Stripe, which are never made inside a database transaction.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from marketplace.models import Payout, ProviderProfile, StripeEvent
from marketplace.money import payouts as books
from marketplace.money.payouts import PayoutBalance, payout_balance
from scheduler.errors import Conflict, DomainError, NotFound, PermissionDenied

from . import connect
from .connect import AccountStatus, TransferNotSent, TransferRefused

__all__ = ["AccountStatus", "PayoutBalance", "payout_balance", "provider_profile", "payout_request",
           "payout_cancel", "payout_reject", "payout_approve", "payout_send", "payouts_resend",
           "payout_account_connect", "payout_account_status", "bank_payout_failure", "transfers_simulated"]


def transfers_simulated() -> bool:
    """Payouts are paid by a simulated transfer on this server (the demo: no Stripe Connect)."""
    return connect.simulated()


def provider_profile(user) -> ProviderProfile:
    """The user's provider profile; PermissionDenied (not_a_provider) for an account that is not a provider."""
    profile = ProviderProfile.of(user)
    if profile is None:
        raise PermissionDenied("Payouts are for providers: become a provider (accept the provider terms and say "
                               "where payouts go) first.", code="not_a_provider")
    return profile


def _destination(profile: ProviderProfile) -> str:
    if connect.simulated():
        return ""
    if not profile.stripe_account_id:
        raise Conflict("Connect a payout account first (Stripe onboarding, on the Earnings page): payouts are "
                       "transferred to it.", code="no_payout_account")
    return profile.stripe_account_id


def payout_request(*, provider, amount, now: datetime | None = None) -> Payout:
    """A provider asks for `amount` USD of what is payable (money/payouts.py checks the amount under a lock)."""
    _destination(provider_profile(provider))
    return books.payout_open(provider=provider, amount=amount, now=now)


def payout_cancel(*, provider, payout_id) -> Payout:
    """The provider withdraws a request not decided yet."""
    return books.payout_cancel(provider=provider, payout_id=payout_id)


def payout_reject(*, payout_id, by, note: str = "") -> Payout:
    """An operator refuses a request."""
    return books.payout_reject(payout_id=payout_id, by=by, note=note)


def payout_approve(*, payout_id, by, now: datetime | None = None) -> Payout:
    """An operator approves a request: its money leaves earnings (one transaction), then its transfer is sent and
    the payout becomes paid, or failed with the money back (another). Stripe unreachable leaves it approved: the
    beat sends it again (`payouts_resend`)."""
    payout = Payout.objects.filter(pk=payout_id).select_related("provider").first()
    if payout is None:
        raise NotFound("no such payout")
    profile = ProviderProfile.objects.filter(user_id=payout.provider_id).first()
    if profile is None and not connect.simulated():
        raise Conflict("This account is no longer a provider: reject the request.", code="not_a_provider")
    destination = _destination(profile) if profile is not None else ""
    connect.transfers_configured()  # before any money moves: an approval that cannot be sent is refused
    books.payout_approve(payout_id=payout.pk, by=by, destination=destination, now=now)
    return payout_send(payout_id=payout.pk)


def payout_send(*, payout_id) -> Payout:
    """Send an approved payout's transfer and record what came of it; any other payout is returned as it is."""
    payout = Payout.objects.get(pk=payout_id)
    if payout.state != Payout.State.APPROVED:
        return payout
    try:
        transfer = connect.transfer_send(payout_id=payout.pk, provider_id=payout.provider_id, amount=payout.amount,
                                         destination=payout.destination)
    except TransferRefused as exc:
        return books.payout_mark_failed(payout_id=payout.pk, reason=exc.message)
    except TransferNotSent as exc:
        books.payout_send_error(payout_id=payout.pk, error=exc.message)
        payout.refresh_from_db()
        return payout
    return books.payout_mark_paid(payout_id=payout.pk, transfer_id=transfer.id, simulated=transfer.simulated)


def payouts_resend(*, now: datetime | None = None) -> int:
    """Beat: send again the approved payouts whose transfer did not get through (Stripe unreachable, a worker
    gone between the approval and the call) at least PAYOUT_RESEND_SECONDS after their approval."""
    before = (now or timezone.now()) - timedelta(seconds=settings.PAYOUT_RESEND_SECONDS)
    stuck = list(Payout.objects.filter(state=Payout.State.APPROVED, decided_at__lte=before)
                 .order_by("decided_at").values_list("pk", flat=True)[:100])
    for payout_id in stuck:
        payout_send(payout_id=payout_id)
    return len(stuck)


def payout_account_connect(*, provider, refresh_url: str, return_url: str) -> str:
    """Where to send the provider to connect (or finish connecting) its payout account: Stripe's onboarding. The
    Express account is created once (a second click finds it)."""
    profile = provider_profile(provider)
    if connect.simulated():
        raise Conflict("Payouts are paid by a simulated transfer on this server (the demo has no Stripe Connect): "
                       "there is no payout account to connect.", code="connect_unavailable")
    if not profile.stripe_account_id:
        account_id = connect.account_create(user_id=provider.pk, country=profile.payout_country,
                                            email=getattr(provider, "email", "") or "")
        # Compare-and-set: two clicks at once keep one account (Stripe's idempotency key gives both the same).
        ProviderProfile.objects.filter(pk=profile.pk, stripe_account_id="").update(stripe_account_id=account_id)
        profile.refresh_from_db()
    return connect.account_link(account_id=profile.stripe_account_id, refresh_url=refresh_url, return_url=return_url)


def payout_account_status(*, provider) -> AccountStatus | None:
    """What Stripe says of the provider's payout account; None before it has one (or when transfers are simulated)."""
    profile = ProviderProfile.objects.filter(user_id=provider.pk).first()
    if profile is None or not profile.stripe_account_id or connect.simulated():
        return None
    try:
        return connect.account_status(account_id=profile.stripe_account_id)
    except DomainError:
        return None


def bank_payout_failure(*, provider) -> dict | None:
    """The latest payout Stripe could not make from the provider's Connect account to its bank (`payout.failed`,
    a Connect event): the money stays in that Stripe balance until the bank details are fixed. None if none, or
    if a later bank payout went through."""
    account = ProviderProfile.objects.filter(user_id=provider.pk).values_list("stripe_account_id", flat=True).first()
    if not account:
        return None
    latest = (StripeEvent.objects.filter(type__in=["payout.failed", "payout.paid"], payload__account=account)
              .order_by("-received_at", "-pk").first())
    if latest is None or latest.type != "payout.failed":
        return None
    obj = (latest.payload.get("data") or {}).get("object") or {}
    return {"at": latest.received_at, "message": obj.get("failure_message") or "the bank refused the payout",
            "code": obj.get("failure_code") or ""}
