"""The payout state machine and the payable arithmetic, without a database (money/payouts.py's pure parts)."""
from __future__ import annotations

from decimal import Decimal as D

import pytest

from marketplace.models import Payout
from marketplace.money.payouts import TRANSITIONS, payable_of, request_refusal, transition_check
from scheduler.errors import Conflict

S = Payout.State
ALLOWED = {(S.REQUESTED, S.APPROVED), (S.REQUESTED, S.REJECTED), (S.REQUESTED, S.CANCELLED),
           (S.APPROVED, S.PAID), (S.APPROVED, S.FAILED), (S.PAID, S.FAILED)}


@pytest.mark.parametrize("state", list(S))
@pytest.mark.parametrize("to", [S.APPROVED, S.REJECTED, S.CANCELLED, S.PAID, S.FAILED])
def test_only_the_drawn_transitions_are_allowed(state, to):
    if (state, to) in ALLOWED:
        transition_check(state=state, to=to)
    else:
        with pytest.raises(Conflict) as exc:
            transition_check(state=state, to=to)
        assert exc.value.code == "payout_state" and exc.value.details == {"state": str(state)}
        assert exc.value.message.startswith(f"This payout is {S(state).label}: it can no longer be")


def test_every_end_state_is_final_and_paid_only_falls_back_to_failed():
    assert set(TRANSITIONS) == {S.REQUESTED, S.APPROVED, S.PAID}
    assert TRANSITIONS[S.PAID] == {S.FAILED}


def test_cancelling_a_paid_payout_says_so_in_words():
    with pytest.raises(Conflict, match="This payout is paid: it can no longer be cancelled."):
        transition_check(state=S.PAID, to=S.CANCELLED)


@pytest.mark.parametrize("earnings, on_hold, requested, payable", [
    ("100", "0", "0", "100"),
    ("100", "30", "0", "70"),
    ("100", "30", "50", "20"),
    ("100", "30", "80", "0"),  # never below zero
    ("5", "10", "0", "0"),  # a refund out of earnings still on hold took the balance under what is held
    ("12.345678", "0.000001", "0", "12.345677"),
])
def test_payable_is_earnings_less_what_is_held_and_requested(earnings, on_hold, requested, payable):
    assert payable_of(earnings=D(earnings), on_hold=D(on_hold), requested=D(requested)) == D(payable)


def refusal(amount, payable="100", minimum="10", open_request=False):
    return request_refusal(amount=D(amount), payable=D(payable), minimum=D(minimum), open_request=open_request,
                           hold_days=7)


@pytest.mark.parametrize("amount, payable, code, field", [
    ("10.005", "100", "invalid", "amount"),  # whole cents only
    ("0", "100", "invalid", "amount"),
    ("-5", "100", "invalid", "amount"),
    ("9.99", "100", "below_minimum", "amount"),
    ("100.01", "100.009", "exceeds_payable", "amount"),
    ("50", "49.999999", "exceeds_payable", "amount"),
])
def test_a_request_outside_the_rules_is_refused_with_its_field(amount, payable, code, field):
    error = refusal(amount, payable)
    assert error is not None and (error.code, error.field) == (code, field)


def test_the_exceeding_request_is_told_what_it_may_ask_rounded_down_to_the_cent():
    error = refusal("80", payable="79.999")
    assert error.message == ("You can request at most 79.99 USD now: earnings become payable 7 days after they "
                             "are earned.")
    assert error.details == {"payable": "79.99"}


def test_with_less_payable_than_the_minimum_the_provider_is_told_both():
    error = refusal("10", payable="4.567")
    assert error.message == ("Payouts start at 10.00 USD and 4.56 USD is payable now: earnings become payable 7 "
                             "days after they are earned.")


def test_an_open_payout_refuses_a_second_request_with_a_conflict():
    error = refusal("20", open_request=True)
    assert isinstance(error, Conflict) and error.code == "payout_open"


@pytest.mark.parametrize("amount", ["10", "10.00", "55.55", "100"])
def test_a_request_within_the_rules_is_accepted(amount):
    assert refusal(amount) is None
