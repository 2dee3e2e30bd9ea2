"""Provider payouts in the books: what a provider may be paid now, and every state change of a payout as one
transaction together with its ledger movement (marketplace/products/payouts/ talks to Stripe; this keeps the books).

    requested ──approve──► approved ──transfer sent──► paid ──transfer reversed in full──► failed
        │                      └──transfer refused──► failed
        ├──reject (an operator)──► rejected
        └──cancel (the provider)──► cancelled

The money (movements.py):

    approve           earnings −a, payouts_clearing +a          kind payout
    transfer sent     payouts_clearing −a, stripe_clearing +a   kind payout_sent
    transfer refused  payouts_clearing −a, earnings +a          kind payout_return
    transfer reversed stripe_clearing −r, earnings +r           kind payout_return (r: what Stripe reversed since)

A request moves no money: until it is decided it counts against what is payable. Payable = the earnings balance,
less what is on hold, less an open request. On hold: earnings credited less than PAYOUT_HOLD_DAYS ago, and a
reserved window's booking until PAYOUT_HOLD_DAYS after its window ends (a window the platform does not deliver is
refunded out of the provider's earnings when it ends: that money must still be there). A refund taken back out of
earnings counts at once. Each transition locks the provider's earnings account first, then the payout row: two
approvals, or a request and an approval, queue there and the second sees what the first did.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Min, OuterRef, Q, Subquery
from django.utils import timezone

from marketplace.amounts import CENT, ZERO, money, usd
from marketplace.models import Account, LedgerEntry, Payout, Reservation
from scheduler.errors import Conflict, DomainError, NotFound

from . import ledger, movements
from .ledger import key_of
from .statements import exact_sum

State = Payout.State

# Which state may follow which; anything else is refused with the payout's state in words.
TRANSITIONS: dict[str, frozenset[str]] = {
    State.REQUESTED: frozenset({State.APPROVED, State.REJECTED, State.CANCELLED}),
    State.APPROVED: frozenset({State.PAID, State.FAILED}),
    State.PAID: frozenset({State.FAILED}),  # its transfer reversed in full
}
_VERB = {State.APPROVED: "approved", State.REJECTED: "rejected", State.CANCELLED: "cancelled",
         State.PAID: "marked paid", State.FAILED: "marked failed"}


def transition_check(*, state: str, to: str) -> None:
    """Refuse (Conflict, code payout_state) a change the state machine does not allow."""
    if to not in TRANSITIONS.get(state, frozenset()):
        raise Conflict(f"This payout is {State(state).label}: it can no longer be {_VERB[State(to)]}.",
                       code="payout_state", details={"state": str(state)})


# --- what is payable ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PayoutBalance:
    """A provider's earnings as payouts see them (USD, micro-dollars)."""

    earnings: Decimal  # in the earnings account now
    on_hold: Decimal  # earned, not payable yet
    requested: Decimal  # an open request, not decided yet
    in_flight: Decimal  # approved, its transfer on its way
    paid: Decimal  # paid out, less what Stripe reversed
    next_release_at: datetime | None  # when the earliest money on hold becomes payable
    minimum: Decimal
    hold_days: float

    @property
    def payable(self) -> Decimal:
        return payable_of(earnings=self.earnings, on_hold=self.on_hold, requested=self.requested)

    @property
    def payable_cents(self) -> Decimal:
        """What may be requested now: payable, rounded down to the cent (a transfer moves whole cents)."""
        return self.payable.quantize(CENT, rounding=ROUND_DOWN)


def payable_of(*, earnings: Decimal, on_hold: Decimal, requested: Decimal) -> Decimal:
    """The earnings balance less what is on hold and what an open request claims; never below zero (a refund out
    of earnings still on hold may take the balance under what is held)."""
    return max(ZERO, earnings - on_hold - requested)


def _already_open() -> Conflict:
    return Conflict("You have a payout open already: wait until it is paid, or cancel the request first.",
                    code="payout_open")


def request_refusal(*, amount: Decimal, payable: Decimal, minimum: Decimal, open_request: bool,
                    hold_days: float) -> DomainError | None:
    """Why a request for `amount` cannot be made now, or None."""
    if amount != amount.quantize(CENT) or amount <= 0:
        return DomainError("A payout is a positive amount in whole cents, e.g. 25.00.", field="amount")
    if open_request:
        return _already_open()
    if amount < minimum:
        return DomainError(f"A payout is at least {minimum:.2f} USD.", field="amount", code="below_minimum",
                           details={"minimum": str(minimum)})
    if amount > payable:
        cents = payable.quantize(CENT, rounding=ROUND_DOWN)
        said = (f"You can request at most {cents:.2f} USD now" if cents >= minimum else
                f"Payouts start at {minimum:.2f} USD and {cents:.2f} USD is payable now")
        return DomainError(f"{said}: earnings become payable {hold_days:g} days after they are earned.",
                           field="amount", code="exceeds_payable", details={"payable": str(cents)})
    return None


def payout_balance(*, provider, now: datetime | None = None) -> PayoutBalance:
    """What `provider` has earned, holds, may request and was paid (a few queries, whatever the history)."""
    now = now or timezone.now()
    hold = timedelta(days=settings.PAYOUT_HOLD_DAYS)
    cutoff = now - hold
    user_id = getattr(provider, "pk", provider)
    account = Account.objects.filter(user_id=user_id, kind=Account.Kind.EARNINGS).values_list("pk", "balance").first()
    on_hold, releases = ZERO, []
    if account is not None:
        earned = (LedgerEntry.objects.filter(account_id=account[0], amount__gt=0)
                  .exclude(transaction__kind__in=movements.PAYOUT_KINDS))
        recent = earned.exclude(transaction__kind="reservation").filter(created_at__gt=cutoff)
        on_hold = exact_sum(recent)
        first = recent.aggregate(first=Min("created_at"))["first"]
        releases += [first + hold] if first else []
        window_end = Subquery(Reservation.objects.filter(order_id=OuterRef("transaction__order_id"),
                                                         parent__isnull=True).values("ends_at")[:1])
        for amount, created, ends in (earned.filter(transaction__kind="reservation").annotate(window_end=window_end)
                                      .filter(Q(created_at__gt=cutoff) | Q(window_end__gt=cutoff))
                                      .values_list("amount", "created_at", "window_end")):
            on_hold += amount
            releases.append(max(created, ends or created) + hold)
    payouts = Payout.objects.filter(provider_id=user_id)
    return PayoutBalance(
        earnings=account[1] if account is not None else ZERO, on_hold=on_hold,
        requested=exact_sum(payouts.filter(state=State.REQUESTED)),
        in_flight=exact_sum(payouts.filter(state=State.APPROVED)),
        paid=exact_sum(payouts.filter(state=State.PAID)) - exact_sum(payouts.filter(state=State.PAID),
                                                                    "reversed_amount"),
        next_release_at=min(releases) if releases else None, minimum=settings.PAYOUT_MINIMUM,
        hold_days=settings.PAYOUT_HOLD_DAYS)


# --- transitions, one transaction each ----------------------------------------------------------------------

def _lock_earnings(provider_id) -> None:
    # Every payout transition locks the provider's earnings account first (postings lock it too): the race is
    # two requests, a request and an approval, or two approvals reading the same balance.
    ledger.locked_balances([key_of(user=provider_id, kind="earnings")])


def _locked(payout_id, *, provider=None) -> Payout:
    """The payout locked (after its provider's earnings); NotFound for a missing one or, with `provider`,
    someone else's."""
    qs = Payout.objects.filter(**({"provider": provider} if provider is not None else {}))
    try:
        provider_id = qs.filter(pk=payout_id).values_list("provider_id", flat=True).first()
    except (ValueError, ValidationError):
        provider_id = None
    if provider_id is None:
        raise NotFound("no such payout")
    _lock_earnings(provider_id)
    return Payout.objects.select_for_update().get(pk=payout_id)


def _short(payout: Payout) -> str:
    return f"payout {str(payout.pk)[:8]}"


def payout_open(*, provider, amount, now: datetime | None = None) -> Payout:
    """Record `provider`'s request for `amount` USD (whole cents, at least PAYOUT_MINIMUM, at most payable now, one
    open payout at a time); no money moves until an operator approves it."""
    amount = money(amount)
    with transaction.atomic():
        _lock_earnings(provider.pk)
        balance = payout_balance(provider=provider, now=now)
        refusal = request_refusal(amount=amount, payable=balance.payable, minimum=balance.minimum,
                                  open_request=Payout.objects.filter(provider=provider, state__in=Payout.OPEN_STATES)
                                  .exists(), hold_days=balance.hold_days)
        if refusal is not None:
            raise refusal
        try:
            with transaction.atomic():  # the database's one-open-payout rule, should a path skip the lock
                return Payout.objects.create(provider=provider, amount=amount.quantize(CENT))
        except IntegrityError:
            raise _already_open() from None


def payout_cancel(*, provider, payout_id) -> Payout:
    """The provider withdraws its request (only while it is not decided)."""
    with transaction.atomic():
        payout = _locked(payout_id, provider=provider)
        transition_check(state=payout.state, to=State.CANCELLED)
        payout.state = State.CANCELLED
        payout.save(update_fields=["state", "updated_at"])
    return payout


def payout_reject(*, payout_id, by, note: str = "", now: datetime | None = None) -> Payout:
    """An operator refuses the request; nothing was moved, nothing moves."""
    with transaction.atomic():
        payout = _locked(payout_id)
        transition_check(state=payout.state, to=State.REJECTED)
        payout.state, payout.decided_by, payout.decided_at = State.REJECTED, by, now or timezone.now()
        payout.note = (note or "").strip()[:400]
        payout.save(update_fields=["state", "decided_by", "decided_at", "note", "updated_at"])
    return payout


def payout_approve(*, payout_id, by, destination: str, now: datetime | None = None) -> Payout:
    """An operator approves the request: its amount leaves the provider's earnings for the payouts in flight, as
    long as it is still payable (a refund out of earnings since the request may have taken it)."""
    now = now or timezone.now()
    with transaction.atomic():
        payout = _locked(payout_id)
        transition_check(state=payout.state, to=State.APPROVED)
        balance = payout_balance(provider=payout.provider_id, now=now)
        # The request itself is counted as requested: what it may take is payable with it left out.
        available = payable_of(earnings=balance.earnings, on_hold=balance.on_hold,
                               requested=balance.requested - payout.amount)
        if payout.amount > available:
            raise Conflict(f"Only {available.quantize(CENT, rounding=ROUND_DOWN):.2f} USD of this provider's earnings "
                           f"is payable now (refunds since the request took the rest): reject this request.",
                           code="exceeds_payable", details={"payable": str(available)})
        movements.payout(provider=payout.provider_id, amount=payout.amount, payout_id=payout.pk,
                         memo=f"{_short(payout)} approved: {usd(payout.amount)} on its way")
        payout.state, payout.decided_by, payout.decided_at, payout.destination = State.APPROVED, by, now, destination
        payout.save(update_fields=["state", "decided_by", "decided_at", "destination", "updated_at"])
    return payout


def payout_mark_paid(*, payout_id, transfer_id: str, simulated: bool, now: datetime | None = None) -> Payout:
    """Its transfer left: the money is no longer in flight. Idempotent for the same transfer."""
    with transaction.atomic():
        payout = _locked(payout_id)
        if payout.state == State.PAID and payout.transfer_id == transfer_id:
            return payout
        transition_check(state=payout.state, to=State.PAID)
        how = "a simulated transfer (demo: no Stripe Connect)" if simulated else f"Stripe transfer {transfer_id}"
        movements.payout_sent(amount=payout.amount, payout_id=payout.pk, memo=f"{_short(payout)} paid by {how}")
        payout.state, payout.transfer_id, payout.simulated = State.PAID, transfer_id, simulated
        payout.paid_at, payout.last_error = now or timezone.now(), ""
        payout.save(update_fields=["state", "transfer_id", "simulated", "paid_at", "last_error", "updated_at"])
    return payout


def payout_mark_failed(*, payout_id, reason: str, now: datetime | None = None) -> Payout:
    """Its transfer was refused: the money goes back to the provider's earnings (payable again)."""
    with transaction.atomic():
        payout = _locked(payout_id)
        transition_check(state=payout.state, to=State.FAILED)
        if payout.state != State.APPROVED:
            raise Conflict("A paid payout fails only when Stripe reverses its transfer.", code="payout_state",
                           details={"state": payout.state})
        movements.payout_return(provider=payout.provider_id, amount=payout.amount, sent=False,
                                idempotency_key=f"payout:{payout.pk}:returned",
                                memo=f"{_short(payout)} failed, back in earnings: {reason}"[:400])
        payout.state, payout.failed_at, payout.failure_reason = State.FAILED, now or timezone.now(), reason[:400]
        payout.save(update_fields=["state", "failed_at", "failure_reason", "updated_at"])
    return payout


def payout_send_error(*, payout_id, error: str) -> None:
    """A transient error sending the transfer (Stripe unreachable): kept for operators; it is sent again."""
    Payout.objects.filter(pk=payout_id, state=State.APPROVED).update(last_error=error[:400], updated_at=timezone.now())


def transfer_reversed(*, transfer_id: str, reversed_cents: int, now: datetime | None = None) -> Payout:
    """Stripe reversed (part of) a paid payout's transfer (`transfer.reversed`, cumulative `amount_reversed`):
    what it reversed since we last heard goes back to the provider's earnings, once per total; all of it makes
    the payout failed. An older event (a smaller total) changes nothing."""
    payout_id = Payout.objects.filter(transfer_id=transfer_id).values_list("pk", flat=True).first()
    if payout_id is None:
        raise NotFound(f"no payout was paid by transfer {transfer_id}")
    with transaction.atomic():
        payout = _locked(payout_id)
        total = (Decimal(reversed_cents) / 100).quantize(CENT)
        if total > payout.amount:
            raise DomainError(f"Stripe reports {total} USD reversed of a {payout.amount} USD transfer")
        missing = total - payout.reversed_amount
        if missing <= 0 or payout.state != State.PAID:
            return payout
        movements.payout_return(provider=payout.provider_id, amount=missing, sent=True,
                                idempotency_key=f"payout:{payout.pk}:reversed:{total}",
                                memo=f"{_short(payout)}: Stripe reversed {usd(missing)} of transfer {transfer_id}")
        payout.reversed_amount = total
        fields = ["reversed_amount", "updated_at"]
        if total == payout.amount:
            transition_check(state=payout.state, to=State.FAILED)
            payout.state, payout.failed_at = State.FAILED, now or timezone.now()
            payout.failure_reason = "Stripe reversed the transfer: the money is back in your earnings."
            fields += ["state", "failed_at", "failure_reason"]
        payout.save(update_fields=fields)
    return payout
