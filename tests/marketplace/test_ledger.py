"""The ledger: balanced, exact, idempotent, never a negative wallet (also under concurrency on PostgreSQL)."""
from __future__ import annotations

import threading
import uuid
from decimal import Decimal as D

import pytest
from django.db import IntegrityError, close_old_connections, transaction
from hypothesis import HealthCheck, settings as hsettings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from marketplace.models import Account, LedgerEntry, LedgerTransaction
from marketplace.money import ledger, movements
from marketplace.money.check import ledger_check
from scheduler.errors import Conflict, DomainError
from tests.factories import UserFactory


def topup(user, amount: str, key: str | None = None) -> LedgerTransaction:
    return ledger.post(kind="topup", memo="test top-up", idempotency_key=key or f"t:{uuid.uuid4()}",
                       lines=[(ledger.platform_account("stripe_clearing"), -D(amount)),
                              (ledger.account_for(user=user, kind="wallet"), D(amount))])


@pytest.mark.django_db
class TestPost:
    def test_a_charge_splits_the_buyer_money_between_provider_and_platform_fee(self):
        buyer, provider = UserFactory(), UserFactory()
        topup(buyer, "10")
        txn = movements.charge(kind="usage", buyer=buyer, provider=provider, amount=D("3.333333"), fee_rate=D("0.10"),
                                  idempotency_key="u1")
        amounts = {e.account.kind: e.amount for e in txn.entries.select_related("account")}
        # fee = 0.3333333 rounded half-up to the micro-dollar
        assert amounts == {"wallet": D("-3.333333"), "earnings": D("3.000000"), "platform_fees": D("0.333333")}
        assert ledger.wallet_balance(user=buyer) == D("6.666667")
        assert ledger.balance(account=ledger.account_for(user=provider, kind="earnings")) == D("3")
        assert ledger_check() == []

    def test_a_stripe_top_up_reads_in_the_consoles_money_in_the_ledger(self):
        buyer = UserFactory()
        txn = movements.topup(user=buyer, amount=D("20.000000"), intent_id="pi_123")
        assert txn.memo == "top-up of $20.00 via Stripe pi_123"
        assert ledger.wallet_balance(user=buyer) == D("20")

    def test_the_same_idempotency_key_twice_posts_one_transaction(self):
        buyer = UserFactory()
        first = topup(buyer, "5", key="same")
        again = topup(buyer, "5", key="same")
        assert first.pk == again.pk
        assert LedgerTransaction.objects.filter(idempotency_key="same").count() == 1
        assert ledger.wallet_balance(user=buyer) == D("5")

    def test_an_idempotency_key_reused_for_another_kind_is_a_conflict(self):
        buyer = UserFactory()
        topup(buyer, "5", key="k")
        with pytest.raises(Conflict):
            movements.credit(user=buyer, amount=D("1"), idempotency_key="k", memo="x")
        assert ledger.wallet_balance(user=buyer) == D("5")

    def test_insufficient_funds_raises_402_and_writes_nothing(self):
        buyer, provider = UserFactory(), UserFactory()
        topup(buyer, "1.50")
        before = (LedgerTransaction.objects.count(), LedgerEntry.objects.count())
        with pytest.raises(ledger.InsufficientFunds) as err:
            movements.charge(kind="usage", buyer=buyer, provider=provider, amount=D("1.500001"), idempotency_key="x")
        assert err.value.status == 402 and err.value.code == "insufficient_funds"
        assert (LedgerTransaction.objects.count(), LedgerEntry.objects.count()) == before
        assert ledger.wallet_balance(user=buyer) == D("1.5")
        assert not Account.objects.filter(user=provider, kind="earnings", balance__gt=0).exists()

    @pytest.mark.parametrize("lines, message", [
        ([("wallet", "1"), ("clearing", "-0.999999")], "unbalanced"),
        ([("wallet", "0")], "non-zero"),
        ([], "non-zero"),
        ([("wallet", "1.0000001"), ("clearing", "-1.0000001")], "six decimal places"),
        ([("wallet", "NaN"), ("clearing", "1")], "finite"),
    ])
    def test_malformed_transactions_are_refused_and_write_nothing(self, lines, message):
        buyer = UserFactory()
        accounts = {"wallet": ledger.account_for(user=buyer, kind="wallet"),
                    "clearing": ledger.platform_account("stripe_clearing")}
        with pytest.raises(DomainError, match=message):
            ledger.post(kind="adjustment", memo="bad", lines=[(accounts[a], D(v)) for a, v in lines])
        assert not LedgerTransaction.objects.exists()

    def test_money_is_never_a_float(self):
        buyer = UserFactory()
        with pytest.raises(TypeError):
            ledger.post(kind="topup", memo="float", lines=[(ledger.account_for(user=buyer, kind="wallet"), 0.1),
                                                            (ledger.platform_account("stripe_clearing"), -0.1)])

    def test_the_database_refuses_a_negative_wallet_even_past_the_service(self):
        wallet = ledger.account_for(user=UserFactory(), kind="wallet")
        with pytest.raises(IntegrityError), transaction.atomic():
            Account.objects.filter(pk=wallet.pk).update(balance=D("-0.000001"))

    def test_a_refund_reverses_a_charge_pro_rata_and_a_credit_comes_from_promotions(self):
        buyer, provider = UserFactory(), UserFactory()
        topup(buyer, "10")
        charge = movements.charge(buyer=buyer, provider=provider, amount=D("4"), fee_rate=D("0.25"),
                               kind="reservation", idempotency_key="r")
        movements.refund(original=charge, amount=D("1"), idempotency_key="r-back")
        movements.credit(user=buyer, amount=D("0.50"), idempotency_key="comp", memo="spot notice", source="credits")
        assert ledger.wallet_balance(user=buyer) == D("7.5")
        assert ledger.balance(account=ledger.account_for(user=provider, kind="earnings")) == D("2.25")
        assert ledger.balance(account=ledger.platform_account("platform_fees")) == D("0.75")
        assert ledger.balance(account=ledger.platform_account("promotions")) == D("-0.5")
        assert ledger_check() == []

    def test_account_kinds_match_their_owner(self):
        with pytest.raises(DomainError):
            ledger.account_for(user=None, kind="wallet")
        with pytest.raises(DomainError):
            ledger.account_for(user=UserFactory(), kind="platform_fees")
        assert ledger.platform_account("fees").pk == ledger.platform_account("platform_fees").pk


class LedgerMachine(RuleBasedStateMachine):
    """Random top-ups, charges, refunds and credits; the books must balance after every step."""

    @initialize()
    def setup(self):
        LedgerEntry.objects.all().delete()
        LedgerTransaction.objects.all().delete()
        Account.objects.all().delete()
        self.buyers = [UserFactory(username=f"buyer{i}") for i in range(2)]
        self.provider = UserFactory(username="provider")
        self.charges: list[LedgerTransaction] = []
        self.expected = {b.pk: D("0") for b in self.buyers}

    amounts = st.decimals(min_value=D("0.000001"), max_value=D("500"), places=6)

    @rule(i=st.integers(0, 1), amount=amounts)
    def top_up(self, i, amount):
        topup(self.buyers[i], str(amount))
        self.expected[self.buyers[i].pk] += amount

    @rule(i=st.integers(0, 1), amount=amounts, rate=st.decimals(min_value=0, max_value=1, places=3))
    def charge(self, i, amount, rate):
        buyer = self.buyers[i]
        try:
            txn = movements.charge(kind="usage", buyer=buyer, provider=self.provider, amount=amount, fee_rate=rate,
                                      idempotency_key=f"c:{uuid.uuid4()}")
        except ledger.InsufficientFunds:
            assert self.expected[buyer.pk] < amount
            return
        self.charges.append(txn)
        self.expected[buyer.pk] -= amount

    @precondition(lambda self: self.charges)
    @rule(data=st.data())
    def refund(self, data):
        charge = self.charges.pop(data.draw(st.integers(0, len(self.charges) - 1)))
        wallet_line = charge.entries.get(account__kind="wallet")
        try:
            movements.refund(original=charge, idempotency_key=f"r:{charge.pk}")
        except DomainError:  # the provider's earnings may already be lower than its share (refund of old work)
            return
        self.expected[wallet_line.account.user_id] -= wallet_line.amount

    @rule(i=st.integers(0, 1), amount=amounts)
    def credit(self, i, amount):
        movements.credit(user=self.buyers[i], amount=amount, idempotency_key=f"g:{uuid.uuid4()}", memo="gift")
        self.expected[self.buyers[i].pk] += amount

    @invariant()
    def books_balance(self):
        if not hasattr(self, "buyers"):
            return
        assert ledger_check() == []
        for buyer in self.buyers:
            assert ledger.wallet_balance(user=buyer) == self.expected[buyer.pk] >= 0


@pytest.mark.django_db
def test_the_ledger_balances_after_any_sequence_of_money_movements():
    machine = LedgerMachine.TestCase
    machine.settings = hsettings(max_examples=25, stateful_step_count=15, deadline=None,
                                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    machine().runTest()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_charges_against_one_wallet_never_take_it_below_zero():
    buyer, provider = UserFactory(), UserFactory()
    topup(buyer, "10")
    results: list[str] = []
    start = threading.Barrier(12)

    def spend(n: int):
        try:
            start.wait()
            movements.charge(kind="usage", buyer=buyer, provider=provider, amount=D("1.000000"), idempotency_key=f"spend:{n}")
            results.append("ok")
        except ledger.InsufficientFunds:
            results.append("broke")
        finally:
            close_old_connections()

    threads = [threading.Thread(target=spend, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == ["broke"] * 2 + ["ok"] * 10
    assert ledger.wallet_balance(user=buyer) == D("0")
    assert ledger_check() == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_same_idempotency_key_posted_concurrently_writes_one_transaction():
    buyer = UserFactory()
    start = threading.Barrier(8)
    ids: list = []

    def post():
        try:
            start.wait()
            ids.append(topup(buyer, "2", key="dup").pk)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(ids) == 8 and len(set(ids)) == 1
    assert ledger.wallet_balance(user=buyer) == D("2")


@pytest.mark.django_db
def test_refunds_of_one_charge_under_different_keys_never_add_up_to_more_than_it_charged():
    buyer, provider = UserFactory(), UserFactory()
    topup(buyer, "10")
    charge = movements.charge(kind="usage", buyer=buyer, provider=provider, amount=D("1.00"), fee_rate=D("0.10"),
                                 idempotency_key="c")
    movements.refund(original=charge, amount=D("0.60"), idempotency_key="r1")
    with pytest.raises(DomainError, match="left of the charged") as err:
        movements.refund(original=charge, amount=D("0.60"), idempotency_key="r2")
    assert err.value.code == "refund_exceeds_charge"
    again = movements.refund(original=charge, amount=D("0.60"), idempotency_key="r1")  # a retry of r1 posts nothing
    rest = movements.refund(original=charge, idempotency_key="r3")  # default: what is left
    assert again.idempotency_key == "r1" and rest.entries.get(account__kind="wallet").amount == D("0.40")
    with pytest.raises(DomainError):
        movements.refund(original=charge, idempotency_key="r4")
    assert ledger.wallet_balance(user=buyer) == D("10") and ledger_check() == []
    charge.refresh_from_db()
    assert (charge.charged_amount, charge.refunded_amount) == (D("1.00"), D("1.00"))


@pytest.mark.django_db
def test_the_database_refuses_refunded_so_far_above_the_charge():
    buyer, provider = UserFactory(), UserFactory()
    topup(buyer, "10")
    charge = movements.charge(kind="usage", buyer=buyer, provider=provider, amount=D("1.00"), idempotency_key="c")
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerTransaction.objects.filter(pk=charge.pk).update(charged_amount=D("1.00"), refunded_amount=D("1.01"))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_full_refunds_of_one_charge_under_different_keys_refund_it_once():
    buyer, provider = UserFactory(), UserFactory()
    topup(buyer, "10")
    charge = movements.charge(kind="usage", buyer=buyer, provider=provider, amount=D("2.00"), idempotency_key="c")
    start = threading.Barrier(8)
    results: list[str] = []

    def back(n: int):
        try:
            start.wait()
            movements.refund(original=charge, idempotency_key=f"refund:{n}")
            results.append("ok")
        except DomainError:
            results.append("refused")
        finally:
            close_old_connections()

    threads = [threading.Thread(target=back, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == ["ok"] + ["refused"] * 7
    assert ledger.wallet_balance(user=buyer) == D("10") and ledger_check() == []
