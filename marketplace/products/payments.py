"""Wallet top-ups and refunds through Stripe PaymentIntents, and the Stripe webhook (top-ups, refunds, and the
events of provider payouts: a transfer reversed, a connected account's bank payout that failed).

The wallet is credited only for a PaymentIntent that Stripe says succeeded: from the signature-verified
`payment_intent.succeeded` webhook, or synchronously when a server-side confirm returns `succeeded`. Both
paths post the same ledger idempotency key "stripe:pi:<id>", so together they credit exactly once; each
webhook event id is also stored once (StripeEvent) and processed in the transaction that stores it.
"""
from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal

import stripe
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from marketplace import events
from marketplace.models import AutoTopUp, Payment, StripeEvent
from marketplace.amounts import CENT, in_cents, money
from marketplace.conf import PaymentsUnavailable, market, stripe_configure
from marketplace.lifecycle.alerts import alert_fire, alert_resolve
from marketplace.money import ledger, movements, payouts as payout_books
from scheduler.errors import Conflict, DomainError, NotFound

log = logging.getLogger(__name__)

TOPUP_MIN = Decimal("1.00")
TOPUP_MAX = Decimal("10000.00")


def stripe_js_url() -> str:
    """Where the page loads Stripe.js from: the fake server's copy when one is configured."""
    base = settings.STRIPE_API_BASE
    return f"{base.rstrip('/')}/js.stripe.com/v3/" if base else "https://js.stripe.com/v3/"


def _provider_error(exc: stripe.StripeError) -> DomainError:
    log.warning("stripe call failed: %s", exc)
    return DomainError("The payment provider could not be reached or refused the request; try again.",
                       code="payment_provider_error", status=502)


def topup_amount(value) -> Decimal:
    """A top-up amount in dollars: whole cents within the configured bounds."""
    amount = money(value)
    if amount != amount.quantize(CENT):
        raise DomainError("a top-up is a whole number of cents", field="amount")
    if not (TOPUP_MIN <= amount <= TOPUP_MAX):
        raise DomainError(f"a top-up is between {TOPUP_MIN} and {TOPUP_MAX} USD", field="amount")
    return amount.quantize(CENT)


def check_server_card(card: str) -> None:
    """A card number confirmed on the server (scripts and tests) must be a 16-digit number, and is taken only
    with a Stripe test-mode key: with a live key a real card number would pass through this server, which only
    Stripe.js in the buyer's browser may see."""
    if not (card.isdigit() and len(card) == 16):
        raise DomainError("a card number has 16 digits", field="card")
    key = settings.STRIPE_SECRET_KEY or ""
    if key and not key.startswith(("sk_test_", "rk_test_")):  # unset: stripe_configure says payments are off
        raise DomainError("Card numbers are taken here only in Stripe test mode: confirm the card in the browser "
                          "(the client secret and Stripe.js in the answer without `card`).", field="card",
                          code="card_number_refused")


def topup_create(*, user, amount: Decimal, card: str | None = None, client_key: str | None = None) -> Payment:
    """Open a PaymentIntent for `amount` USD; with `card`, confirm it now and credit the wallet if it succeeds."""
    amount = topup_amount(amount)
    if client_key is not None and not (0 < len(client_key) <= 200):
        raise DomainError("an Idempotency-Key has 1 to 200 characters", field="idempotency_key")
    if card is not None:
        check_server_card(card)
    if client_key:
        existing = Payment.objects.filter(user=user, client_key=client_key).first()
        if existing is not None:
            if existing.amount != amount:
                raise Conflict("this Idempotency-Key was used for a different amount", code="idempotency_conflict")
            return existing
    stripe_configure()
    payment_id = uuid.uuid4()
    try:
        intent = stripe.PaymentIntent.create(
            amount=in_cents(amount), currency="usd",
            metadata={"user_id": str(user.pk), "payment_id": str(payment_id)},
            # Stripe replays the same PaymentIntent for a retried create with this key.
            idempotency_key=f"topup:{user.pk}:{client_key}" if client_key else f"topup:{payment_id}")
    except stripe.StripeError as exc:
        raise _provider_error(exc) from exc
    try:
        payment = Payment.objects.create(id=payment_id, user=user, stripe_payment_intent_id=intent.id, amount=amount,
                                         client_key=client_key, status=intent.status
                                         if intent.status in Payment.Status.values else "requires_payment_method")
    except IntegrityError:  # a concurrent retry with the same client key won the race
        return Payment.objects.get(user=user, client_key=client_key)
    payment.client_secret = intent.client_secret
    if card is not None:
        payment = _confirm_with_card(payment=payment, card=card)
        payment.client_secret = intent.client_secret
    return payment


def _confirm_with_card(*, payment: Payment, card: str) -> Payment:
    """Confirm on the server with a card number (scripts and tests; browsers use Stripe.js instead)."""
    pi = payment.stripe_payment_intent_id
    try:
        method = stripe.PaymentMethod.create(type="card", card={"number": card, "exp_month": 12, "exp_year": 2034,
                                                                "cvc": "123"})
        stripe.PaymentIntent.modify(pi, payment_method=method.id)
        intent = stripe.PaymentIntent.confirm(pi)
    except stripe.CardError as exc:
        error = exc.error
        decline_code = (getattr(error, "decline_code", None) or getattr(error, "code", None) or "card_declined")
        message = exc.user_message or "Your card was declined."
        Payment.objects.filter(pk=payment.pk).exclude(status=Payment.Status.SUCCEEDED).update(
            status=Payment.Status.FAILED, failure_message=message[:400], decline_code=decline_code[:80])
        raise DomainError(message, code="card_declined", status=402,
                          details={"decline_code": decline_code, "payment": str(payment.pk)}) from exc
    except stripe.StripeError as exc:
        raise _provider_error(exc) from exc
    if intent.status == "succeeded":
        return apply_succeeded_intent(intent_id=intent.id, amount_cents=intent.amount,
                                      currency=intent.currency,
                                      metadata=intent.metadata.to_dict() if intent.metadata else {})
    Payment.objects.filter(pk=payment.pk, status=Payment.Status.REQUIRES_PAYMENT_METHOD).update(
        status=Payment.Status.PROCESSING)
    payment.refresh_from_db()
    return payment


def apply_succeeded_intent(*, intent_id: str, amount_cents: int, currency: str, metadata: dict) -> Payment:
    """Mark the top-up succeeded and credit the wallet once, however often Stripe or we report it."""
    if currency != "usd":
        raise DomainError(f"unexpected currency {currency!r} for {intent_id}")
    with transaction.atomic():
        # Lock the payment row: the webhook and the synchronous confirm may arrive together.
        payment = Payment.objects.select_for_update().filter(stripe_payment_intent_id=intent_id).first()
        if payment is None:
            # The create call reached Stripe but our row was never written (crash between the two): rebuild it.
            user = get_user_model().objects.filter(pk=metadata.get("user_id")).first()
            if user is None:
                raise NotFound(f"no user for PaymentIntent {intent_id}")
            payment = Payment.objects.create(user=user, stripe_payment_intent_id=intent_id,
                                             amount=(Decimal(amount_cents) / 100).quantize(CENT))
        amount = (Decimal(amount_cents) / 100).quantize(CENT)
        if amount != payment.amount:
            raise DomainError(f"PaymentIntent {intent_id} is for {amount} USD, the payment for {payment.amount} USD")
        movements.topup(user=payment.user, amount=amount, intent_id=intent_id)
        if metadata.get(AUTO_TOPUP):
            _auto_settled(intent_id=intent_id)
        if payment.status not in (Payment.Status.SUCCEEDED, Payment.Status.REFUNDED):
            payment.status = Payment.Status.SUCCEEDED
            payment.failure_message = ""
            payment.decline_code = ""
            payment.save(update_fields=["status", "failure_message", "decline_code", "updated_at"])
    return payment


def webhook_receive(*, payload: bytes, signature: str | None) -> StripeEvent:
    """Verify a Stripe webhook and apply its event exactly once; a bad signature writes nothing."""
    if not settings.STRIPE_WEBHOOK_SECRET:
        raise PaymentsUnavailable("Stripe webhooks are not configured (STRIPE_WEBHOOK_SECRET is not set).")
    if not signature:
        raise DomainError("missing Stripe-Signature header", code="invalid_signature")
    try:
        event = stripe.Webhook.construct_event(payload, signature, settings.STRIPE_WEBHOOK_SECRET)
    except stripe.SignatureVerificationError:
        raise DomainError("invalid Stripe signature", code="invalid_signature") from None
    except ValueError:
        raise DomainError("the webhook body is not a Stripe event", code="invalid_payload") from None
    with transaction.atomic():
        try:
            with transaction.atomic():
                payload_dict = event.to_dict()
                stored = StripeEvent.objects.create(event_id=event.id, type=event.type, payload=payload_dict)
        except IntegrityError:
            # Redelivery (or a concurrent duplicate that committed first): it has been applied already.
            return StripeEvent.objects.get(event_id=event.id)
        obj = payload_dict.get("data", {}).get("object", {})  # plain dicts: StripeObject is no mapping
        try:
            _apply_event(event.type, obj, event_id=event.id, account=payload_dict.get("account"))
        except (DomainError, KeyError, TypeError, ValueError) as exc:
            # Not ours or inconsistent: keep the event unprocessed for an operator instead of making Stripe
            # retry for days; nothing was applied (the service's savepoint rolled back).
            log.error("stripe event %s not applied: %s", event.id, getattr(exc, "message", repr(exc)))
            return stored
        StripeEvent.objects.filter(pk=stored.pk).update(processed=True)
        stored.processed = True
    return stored


def _apply_event(event_type: str, obj: dict, *, event_id: str, account: str | None) -> None:
    """Apply one verified event, inside the transaction that stores it; other types are kept for the record."""
    if event_type == "payment_intent.succeeded":
        apply_succeeded_intent(intent_id=obj["id"], amount_cents=int(obj["amount"]), currency=obj["currency"],
                               metadata=obj.get("metadata") or {})
    elif event_type == "charge.refunded":
        apply_charge_refunded(intent_id=obj["payment_intent"], refunded_cents=int(obj["amount_refunded"]),
                              currency=obj["currency"], event_id=event_id)
    elif event_type == "payment_intent.payment_failed":
        error = obj.get("last_payment_error") or {}
        Payment.objects.filter(stripe_payment_intent_id=obj.get("id")).exclude(
            status__in=[Payment.Status.SUCCEEDED, Payment.Status.REFUNDED]).update(
            status=Payment.Status.FAILED, failure_message=(error.get("message") or "")[:400],
            decline_code=(error.get("decline_code") or error.get("code") or "")[:80])
        if (obj.get("metadata") or {}).get(AUTO_TOPUP):
            # A charge left processing failed later; one that failed at once was counted then (not in flight now).
            row = AutoTopUp.objects.filter(last_payment__stripe_payment_intent_id=obj.get("id"),
                                           in_flight_since__isnull=False).first()
            if row is not None:
                _auto_failed(row, error.get("message") or "Your card was declined.", now=timezone.now())
    elif event_type == "transfer.reversed":
        # A provider payout's transfer taken back (Stripe's dashboard or API): the money returns to its earnings.
        if obj.get("currency", "usd") != "usd":
            raise DomainError(f"unexpected currency {obj.get('currency')!r} for transfer {obj.get('id')}")
        payout_books.transfer_reversed(transfer_id=obj["id"], reversed_cents=int(obj["amount_reversed"]))
    elif event_type == "payout.failed" and account:
        # A provider's Connect account could not pay its bank: that money waits in the account's Stripe balance
        # (not ours). The event is kept; the provider's Earnings page says so (products.payouts).
        log.warning("stripe could not pay out connected account %s to its bank: %s", account,
                    obj.get("failure_message") or obj.get("failure_code"))


def apply_charge_refunded(*, intent_id: str, refunded_cents: int, currency: str, event_id: str = "") -> Payment:
    """Reconcile a top-up with Stripe's word on how much of it is refunded in all (`charge.refunded`'s
    cumulative `amount_refunded`): a refund made outside the app (the dashboard), or one whose database
    commit failed after Stripe refunded, is mirrored in the ledger once. Idempotent with payment_refund: both
    work under the payment's row lock and compare against `refunded_amount`, so what the app refunded itself
    is never taken twice; a redelivered or older event (a smaller total) changes nothing."""
    if currency != "usd":
        raise DomainError(f"unexpected currency {currency!r} for {intent_id}")
    with transaction.atomic():
        # Lock the payment: the race is the app's own refund of it committing while Stripe's event arrives.
        payment = Payment.objects.select_for_update().filter(stripe_payment_intent_id=intent_id).first()
        if payment is None:
            raise NotFound(f"no payment for PaymentIntent {intent_id}")
        stripe_total = (Decimal(refunded_cents) / 100).quantize(CENT)
        if stripe_total > payment.amount:
            raise DomainError(f"Stripe reports {stripe_total} USD refunded of a {payment.amount} USD top-up")
        missing = stripe_total - payment.refunded_amount
        if missing <= 0:
            return payment
        from_wallet = min(missing, ledger.wallet_balance(user=payment.user))
        if from_wallet < missing:
            # The buyer spent it before the card was refunded outside the app: the platform bears the rest.
            log.error("refund of %s outside the app: %s USD of it was already spent; the platform bears it",
                      intent_id, missing - from_wallet)
        # One key per Stripe total: a second event with the same total finds it (and the row says so anyway).
        movements.topup_refund(user=payment.user, amount=missing, spent_by_platform=missing - from_wallet,
                               idempotency_key=f"stripe:refund-seen:{intent_id}:{stripe_total}",
                               memo=f"refund {missing} USD of Stripe {intent_id} (reconciled from Stripe)")
        payment.refunded_amount = stripe_total
        if payment.refunded_amount == payment.amount:
            payment.status = Payment.Status.REFUNDED
        payment.save(update_fields=["refunded_amount", "status", "updated_at"])
        log.warning("payment %s: %s USD refunded outside the app reconciled (event %s)", payment.pk, missing,
                    event_id)
    return payment


def payment_refund(*, payment_id, user=None, amount: Decimal | None = None, unspent_only: bool = False) -> Payment:
    """Refund (part of) a succeeded top-up to its card; refuses more than the wallet still holds.

    amount=None refunds all that is left of the top-up; with unspent_only, at most the wallet's whole cents."""
    with transaction.atomic():
        # Lock the payment: two refund clicks must not both refund the same remainder.
        qs = Payment.objects.select_for_update()
        payment = qs.filter(pk=payment_id, **({"user": user} if user is not None else {})).first()
        if payment is None:
            raise NotFound("no such payment")
        if payment.status != Payment.Status.SUCCEEDED:
            raise Conflict(f"only a succeeded top-up can be refunded; this one is {payment.status}",
                           code="not_refundable")
        remaining = payment.amount - payment.refunded_amount
        if amount is None and unspent_only:
            wallet = ledger.wallet_balance(user=payment.user).quantize(CENT, rounding=ROUND_DOWN)
            amount = min(remaining, wallet)
            if amount <= 0:
                raise ledger.InsufficientFunds("The wallet is empty: nothing of this top-up is left to refund.")
        amount = remaining if amount is None else money(amount)
        if amount != amount.quantize(CENT) or not (Decimal("0") < amount <= remaining):
            raise DomainError(f"a refund is a whole number of cents between 0.01 and {remaining} USD", field="amount")
        amount = amount.quantize(CENT)
        stripe_configure()
        key = f"stripe:refund:{payment.stripe_payment_intent_id}:{payment.refunded_amount}"
        # Ledger first (it locks the wallet and refuses spent money), then Stripe: if Stripe refuses, the
        # exception rolls the ledger back. Holding the wallet lock over one HTTP call is the price of never
        # refunding money the buyer has already spent.
        movements.topup_refund(user=payment.user, amount=amount, idempotency_key=key,
                               memo=f"refund {amount} USD of Stripe {payment.stripe_payment_intent_id}")
        try:
            stripe.Refund.create(payment_intent=payment.stripe_payment_intent_id, amount=in_cents(amount),
                                 idempotency_key=key)
        except stripe.StripeError as exc:
            raise _provider_error(exc) from exc
        payment.refunded_amount += amount
        if payment.refunded_amount == payment.amount:
            payment.status = Payment.Status.REFUNDED
        payment.save(update_fields=["refunded_amount", "status", "updated_at"])
    return payment



# --- auto top-up: a card saved with a SetupIntent, charged off session ------------------------------------------
#
# States of an AutoTopUp: no card → card saved (SetupIntent succeeded) → enabled; enabled and the wallet under the
# threshold after a metering post → one charge in flight (in_flight_since, taken by compare-and-set) → succeeded
# (credited, failures back to 0) or failed (failures + 1; at AUTO_TOPUP_MAX_FAILURES it turns itself off, with a
# notice). A charge Stripe leaves processing stays in flight until its webhook settles it, or IN_FLIGHT_STALE passes.

IN_FLIGHT_STALE = timedelta(hours=1)
AUTO_TOPUP = "auto_topup"  # the PaymentIntent's metadata marks an off-session top-up


def auto_topup_of(*, user) -> AutoTopUp:
    """The user's auto top-up settings (unsaved defaults, off and without a card, before the first save)."""
    found = AutoTopUp.objects.filter(user=user).first()
    return found if found is not None else AutoTopUp(user=user)


def _auto_row(user) -> AutoTopUp:
    row, _ = AutoTopUp.objects.select_for_update().get_or_create(user=user)
    return row


def card_setup_start(*, user) -> tuple[AutoTopUp, str]:
    """Start saving a card for auto top-up: a Stripe customer (once) and a SetupIntent for off-session use. Returns
    the row and the SetupIntent's client secret, which Stripe.js confirms with the card in the browser."""
    stripe_configure()
    with transaction.atomic():
        # Lock the row: two setup clicks must not make two Stripe customers.
        row = _auto_row(user)
        try:
            if not row.stripe_customer_id:
                row.stripe_customer_id = stripe.Customer.create(
                    email=user.email or None, metadata={"user_id": str(user.pk)},
                    idempotency_key=f"customer:{user.pk}").id
            intent = stripe.SetupIntent.create(customer=row.stripe_customer_id, usage="off_session",
                                               payment_method_types=["card"], metadata={"user_id": str(user.pk)})
        except stripe.StripeError as exc:
            raise _provider_error(exc) from exc
        row.stripe_setup_intent_id = intent.id
        row.save(update_fields=["stripe_customer_id", "stripe_setup_intent_id", "updated_at"])
    return row, intent.client_secret


def card_setup_finish(*, user, card: str | None = None) -> AutoTopUp:
    """Keep the card of the user's SetupIntent once Stripe says it succeeded; with `card` (scripts and tests;
    browsers confirm with Stripe.js) confirm it here first. A new card clears the failures of the old one."""
    if card is not None:
        check_server_card(card)
    row = auto_topup_of(user=user)
    if not row.stripe_setup_intent_id:
        raise Conflict("Start saving a card first.", code="no_setup")
    stripe_configure()
    try:
        if card is not None:
            method = stripe.PaymentMethod.create(type="card", card={"number": card, "exp_month": 12,
                                                                    "exp_year": 2034, "cvc": "123"})
            intent = stripe.SetupIntent.confirm(row.stripe_setup_intent_id, payment_method=method.id)
        else:
            intent = stripe.SetupIntent.retrieve(row.stripe_setup_intent_id)
        if intent.status != "succeeded" or not intent.payment_method:
            raise Conflict("The card is not saved yet: Stripe has not confirmed it (3-D Secure may be pending).",
                           code="setup_pending", details={"status": intent.status})
        method_id = intent.payment_method if isinstance(intent.payment_method, str) else intent.payment_method.id
        card_facts = stripe.PaymentMethod.retrieve(method_id).to_dict().get("card") or {}
    except stripe.CardError as exc:
        raise DomainError(exc.user_message or "Your card was declined.", code="card_declined", status=402) from exc
    except stripe.StripeError as exc:
        raise _provider_error(exc) from exc
    with transaction.atomic():
        row = _auto_row(user)
        row.stripe_payment_method_id = method_id
        row.card_label = f"{card_facts.get('brand') or 'card'} •••• {card_facts.get('last4') or '????'}"[:40]
        row.failures, row.last_error, row.disabled_reason = 0, "", ""
        row.save(update_fields=["stripe_payment_method_id", "card_label", "failures", "last_error", "disabled_reason",
                                "updated_at"])
        alert_resolve(user=user, subject_key=_auto_alert_key(user.pk))
    return row


def _auto_alert_key(user_id) -> str:
    return f"auto-topup:{user_id}"


def auto_topup_configure(*, user, enabled: bool, threshold, amount) -> AutoTopUp:
    """Turn auto top-up on or off, with the wallet balance under which it tops up and by how much (whole cents)."""
    amount = topup_amount(amount)
    threshold = money(threshold, field="threshold")
    if threshold != threshold.quantize(CENT) or not (Decimal("0") <= threshold <= TOPUP_MAX):
        raise DomainError(f"the threshold is a whole number of cents from 0 to {TOPUP_MAX} USD", field="threshold")
    with transaction.atomic():
        row = _auto_row(user)
        if enabled and not row.stripe_payment_method_id:
            raise Conflict("Save a card first: auto top-up charges a saved card.", code="no_card")
        row.enabled, row.threshold, row.amount = bool(enabled), threshold.quantize(CENT), amount
        if enabled:
            row.failures, row.disabled_reason = 0, ""
        row.save(update_fields=["enabled", "threshold", "amount", "failures", "disabled_reason", "updated_at"])
        if enabled:
            alert_resolve(user=user, subject_key=_auto_alert_key(user.pk))
    return row


def auto_topups_due(*, now: datetime | None = None) -> list[int]:
    """Users whose auto top-up is on, with no charge in flight (or one stale), and whose wallet is under its
    threshold: the meter's task runs auto_topup_run for each after its tick."""
    now = now or timezone.now()
    rows = list(AutoTopUp.objects.filter(enabled=True).exclude(in_flight_since__gt=now - IN_FLIGHT_STALE)
                .values_list("user_id", "threshold"))
    balances = ledger.wallet_balances(u for u, _ in rows)
    return [u for u, threshold in rows if balances.get(u, Decimal("0")) < threshold]


def auto_topup_run(*, user_id, now: datetime | None = None) -> Payment | None:
    """Charge the saved card off session for the configured amount if the wallet is still under the threshold.
    At most one in flight: the row is taken by compare-and-set, so a second task (a redelivery, a second beat)
    does nothing. Returns the payment, or None when nothing was due or another run holds it."""
    now = now or timezone.now()
    # Compare-and-set: the race is two runs for one user (the beat's next tick, a redelivered task).
    taken = (AutoTopUp.objects.filter(user_id=user_id, enabled=True)
             .exclude(in_flight_since__gt=now - IN_FLIGHT_STALE)
             .update(in_flight_since=now, attempts=F("attempts") + 1, last_attempt_at=now))
    if not taken:
        return None
    row = AutoTopUp.objects.select_related("user").get(user_id=user_id)
    if ledger.wallet_balance(user=row.user) >= row.threshold:
        AutoTopUp.objects.filter(pk=row.pk).update(in_flight_since=None)
        return None
    stripe_configure()
    payment_id = uuid.uuid4()
    try:
        intent = stripe.PaymentIntent.create(
            amount=in_cents(row.amount), currency="usd", customer=row.stripe_customer_id,
            payment_method=row.stripe_payment_method_id, off_session=True, confirm=True,
            metadata={"user_id": str(row.user_id), "payment_id": str(payment_id), AUTO_TOPUP: "1"},
            # One key per attempt: a retried call of the same attempt is the same charge at Stripe.
            idempotency_key=f"autotopup:{row.pk}:{row.attempts}")
    except stripe.CardError as exc:
        return _auto_failed(row, exc.user_message or "Your card was declined.", now=now)
    except stripe.StripeError as exc:
        log.warning("auto top-up of %s: stripe call failed: %s", row.user_id, exc)
        return _auto_failed(row, "The payment provider could not be reached or refused the charge.", now=now)
    status = intent.status if intent.status in Payment.Status.values else Payment.Status.PROCESSING
    payment = Payment.objects.create(id=payment_id, user=row.user, stripe_payment_intent_id=intent.id,
                                     amount=row.amount, status=status)
    AutoTopUp.objects.filter(pk=row.pk).update(last_payment=payment)
    if intent.status == "succeeded":
        payment = apply_succeeded_intent(intent_id=intent.id, amount_cents=intent.amount, currency=intent.currency,
                                         metadata=intent.metadata.to_dict() if intent.metadata else {})
    elif intent.status in ("requires_payment_method", "requires_action", "canceled"):
        # Off session nobody can answer 3-D Secure: the card needs the buyer (save it again, on session).
        error = ((intent.to_dict().get("last_payment_error") or {}).get("message")
                 or f"the charge needs the card holder ({intent.status})")
        Payment.objects.filter(pk=payment.pk).update(status=Payment.Status.FAILED, failure_message=error[:400])
        return _auto_failed(row, error, now=now, payment=payment)
    return payment


def _auto_settled(*, intent_id: str) -> None:
    """An off-session top-up succeeded (here or by its webhook): the next one may start; failures are forgiven."""
    AutoTopUp.objects.filter(last_payment__stripe_payment_intent_id=intent_id).update(
        in_flight_since=None, failures=0, last_error="")


def _auto_failed(row: AutoTopUp, message: str, *, now: datetime, payment: Payment | None = None) -> Payment | None:
    """Count a failed off-session charge; at AUTO_TOPUP_MAX_FAILURES in a row turn auto top-up off and say so."""
    limit = market("AUTO_TOPUP_MAX_FAILURES")
    with transaction.atomic():
        row = AutoTopUp.objects.select_for_update().select_related("user").get(pk=row.pk)
        row.failures += 1
        row.last_error, row.in_flight_since = message[:400], None
        off = row.failures >= limit
        if off:
            row.enabled = False
            row.disabled_reason = f"turned off after {row.failures} failed charges in a row: {message}"[:200]
        row.save(update_fields=["failures", "last_error", "in_flight_since", "enabled", "disabled_reason",
                                "updated_at"])
        if off:
            event = {"type": "auto_topup_disabled", "failures": row.failures, "last_error": row.last_error,
                     "message": f"Auto top-up is off: {row.disabled_reason}"}
            # The console hears it as the alert (its bell and sockets), until a card is saved again or auto top-up
            # is turned back on; the budget webhook and the e-mail below are its own (the alert sends neither).
            alert_fire(user=row.user, kind="other", subject_key=_auto_alert_key(row.user_id), severity="critical",
                       title="Auto top-up is off: your card was not charged", detail=row.disabled_reason, email=False,
                       now=now)
            events.notify_webhook(user_id=row.user_id, kind="budget", payload=event)
            if row.user.email:
                events.mail_later(to=row.user.email, subject="Auto top-up is off: your card was not charged",
                                  body=f"Auto top-up of your wallet failed {row.failures} times in a row "
                                       f"({message}) and is now off. Save a card again or top up by hand; "
                                       f"leases stop when the wallet runs out.")
    return payment
