"""Stripe Connect for provider payouts: the one adapter between payouts and Stripe.

- A provider's payout account: `account_create` (an Account of type express asking for the transfers
  capability), `account_link` (an AccountLink of type account_onboarding: Stripe's hosted onboarding, where the
  provider gives its identity and bank details; single use, expires within minutes) and `account_status`.
- A payout: `transfer_send`, a Transfer from the platform's Stripe balance to the provider's account (amount in
  cents, currency, destination, transfer_group = the payout, Stripe idempotency key = the payout id). It first looks
  the payout's transfer_group up, so a payout sent again after Stripe forgot the idempotency key (24 h) is never
  paid twice. Stripe then pays the account's bank on the account's own schedule.
- PAYOUT_TRANSFERS=simulated (the demo: localstripe has no Connect): no call is made and the transfer says it is
  simulated (`simulated`, an id starting with `simulated_`).

A transfer Stripe refuses (InvalidRequestError: no such account, transfers not active on it, the platform's balance
too low) is final: `TransferRefused`, and the payout fails with its money back in earnings. Stripe unreachable, or
failing on its side, is not: `TransferNotSent`, and the payout stays approved to be sent again.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from decimal import Decimal

import stripe
from django.conf import settings

from marketplace.amounts import in_cents
from marketplace.conf import PaymentsUnavailable, stripe_configure
from scheduler.errors import DomainError

log = logging.getLogger(__name__)

CURRENCY = "usd"


class TransferRefused(DomainError):
    status = 502

    def __init__(self, message: str, **kw):
        super().__init__(message, code=kw.pop("code", "transfer_refused"), **kw)


class TransferNotSent(DomainError):
    status = 502

    def __init__(self, message: str = "Stripe could not be reached; the payout is sent again shortly.", **kw):
        super().__init__(message, code=kw.pop("code", "payment_provider_error"), **kw)


@dataclass(frozen=True)
class Transfer:
    id: str
    amount_cents: int
    destination: str
    simulated: bool = False


@dataclass(frozen=True)
class AccountStatus:
    id: str
    details_submitted: bool
    payouts_enabled: bool
    transfers_active: bool
    requirements_due: list = field(default_factory=list)

    @property
    def ready(self) -> bool:
        """Stripe takes transfers to it and pays them out to its bank."""
        return self.transfers_active and self.payouts_enabled


def simulated() -> bool:
    return settings.PAYOUT_TRANSFERS == "simulated"


def transfers_configured() -> None:
    """Refuse (503 payments_unavailable) when transfers go through Stripe and no Stripe key is configured."""
    if not simulated():
        stripe_configure()


def _unreachable(exc: stripe.StripeError) -> DomainError:
    log.warning("stripe connect call failed: %s", exc)
    return TransferNotSent("Stripe could not be reached or failed; try again.")


def account_create(*, user_id: int, country: str, email: str = "") -> str:
    """A new Express account for a provider (its id, acct_...); the same one again for a retry within 24 h."""
    stripe_configure()
    params = {"type": "express", "country": country, "capabilities": {"transfers": {"requested": True}},
              "metadata": {"user_id": str(user_id)}}
    if email:
        params["email"] = email
    try:
        return stripe.Account.create(**params, idempotency_key=f"connect-account:{user_id}").id
    except stripe.StripeError as exc:
        raise _unreachable(exc) from exc


def account_link(*, account_id: str, refresh_url: str, return_url: str) -> str:
    """The URL of Stripe's hosted onboarding for the account (single use, expires within minutes)."""
    stripe_configure()
    try:
        return stripe.AccountLink.create(account=account_id, type="account_onboarding", refresh_url=refresh_url,
                                         return_url=return_url).url
    except stripe.StripeError as exc:
        raise _unreachable(exc) from exc


def account_status(*, account_id: str) -> AccountStatus:
    """What Stripe says of the account: onboarding done, transfers and payouts enabled, what it still needs."""
    stripe_configure()
    try:
        account = stripe.Account.retrieve(account_id).to_dict()
    except stripe.StripeError as exc:
        raise _unreachable(exc) from exc
    return AccountStatus(id=account["id"], details_submitted=bool(account.get("details_submitted")),
                         payouts_enabled=bool(account.get("payouts_enabled")),
                         transfers_active=(account.get("capabilities") or {}).get("transfers") == "active",
                         requirements_due=list((account.get("requirements") or {}).get("currently_due") or []))


def _refusal(exc: stripe.StripeError) -> TransferRefused:
    """What a provider and an operator read when Stripe refuses a transfer (Stripe's code stays a detail)."""
    code = exc.code or ""
    param = getattr(exc, "param", None) or ""
    if code == "balance_insufficient":
        message = ("The platform's Stripe balance could not cover the transfer. The money is back in your earnings: "
                   "request the payout again later.")
    elif param == "destination" or code in ("resource_missing", "account_invalid"):
        message = ("Your payout account cannot receive transfers yet: finish Stripe's onboarding (Connect a payout "
                   "account on the Earnings page), then request the payout again.")
    else:
        detail = exc.user_message or (exc.error.message if exc.error else "") or str(exc)
        message = f"Stripe refused the transfer: {detail}"
    log.warning("stripe refused a transfer (%s): %s", code, exc)
    return TransferRefused(message[:400], details={"stripe_code": code})


def transfer_send(*, payout_id, provider_id: int, amount: Decimal, destination: str) -> Transfer:
    """Pay `amount` USD (whole cents) of payout `payout_id` to `destination` (acct_...), once."""
    cents = in_cents(amount)
    if simulated():
        return Transfer(id=f"simulated_{payout_id.hex}", amount_cents=cents, destination="", simulated=True)
    try:
        stripe_configure()
    except PaymentsUnavailable as exc:  # the key went away since the approval: kept approved, sent again later
        raise TransferNotSent(exc.message) from exc
    group = f"payout_{payout_id}"
    try:
        sent = stripe.Transfer.list(transfer_group=group, limit=1).data
        transfer = sent[0] if sent else stripe.Transfer.create(
            amount=cents, currency=CURRENCY, destination=destination, transfer_group=group,
            description=f"GPU Market payout {payout_id}",
            metadata={"payout_id": str(payout_id), "provider_id": str(provider_id)}, idempotency_key=str(payout_id))
    except stripe.InvalidRequestError as exc:
        raise _refusal(exc) from exc
    except stripe.StripeError as exc:
        raise _unreachable(exc) from exc
    return Transfer(id=transfer.id, amount_cents=transfer.amount, destination=transfer.destination)
