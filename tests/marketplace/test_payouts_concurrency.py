"""Payouts under concurrency on PostgreSQL: threads with their own connections approve the same payout, or request
payouts of the same earnings, at once. Money is paid once and never more than is payable."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from marketplace.models import LedgerTransaction, Payout
from marketplace.money.check import ledger_check
from marketplace.products import payouts
from scheduler.errors import DomainError
from tests.factories import UserFactory
from tests.marketplace.marketsim import earnings
from tests.marketplace.payoutfix import earn, provider_user

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def payout_settings(settings):
    settings.PAYOUT_TRANSFERS = "simulated"
    settings.PAYOUT_HOLD_DAYS = 7.0
    settings.PAYOUT_MINIMUM = D("10.00")


def race(fn, args: list) -> list:
    """fn(arg) for every arg at once (a barrier lines the threads up); each thread closes its own connection."""
    barrier = threading.Barrier(len(args))

    def run(arg):
        try:
            barrier.wait(timeout=30)
            return fn(arg)
        except DomainError as exc:
            return exc
        finally:
            connections.close_all()
    with ThreadPoolExecutor(max_workers=len(args)) as pool:
        return list(pool.map(run, args))


def test_two_operators_approving_one_payout_at_once_pay_it_once():
    provider = provider_user()
    earn(provider, "100", at=timezone.now() - timedelta(days=10))
    payout = payouts.payout_request(provider=provider, amount=D("60"))
    ops = [UserFactory(is_staff=True, is_superuser=True) for _ in range(2)]
    results = race(lambda op: payouts.payout_approve(payout_id=payout.pk, by=op), ops)
    paid = [r for r in results if isinstance(r, Payout)]
    refused = [r for r in results if isinstance(r, DomainError)]
    assert len(paid) == 1 and len(refused) == 1 and refused[0].code == "payout_state"
    assert paid[0].state == Payout.State.PAID
    assert LedgerTransaction.objects.filter(kind="payout").count() == 1
    assert LedgerTransaction.objects.filter(kind="payout_sent").count() == 1
    assert earnings(provider) == D("30") and ledger_check() == []


def test_ten_requests_at_once_open_one_payout():
    provider = provider_user()
    earn(provider, "100", at=timezone.now() - timedelta(days=10))
    results = race(lambda i: payouts.payout_request(provider=provider, amount=D("50")), list(range(10)))
    opened = [r for r in results if isinstance(r, Payout)]
    assert len(opened) == 1 and Payout.objects.count() == 1
    assert {r.code for r in results if isinstance(r, DomainError)} == {"payout_open"}


def test_approving_several_providers_at_once_keeps_the_books_balanced():
    """The payouts in flight and Stripe clearing accounts are shared: approvals of many providers queue on them
    without deadlocking, each moving its own money once."""
    op = UserFactory(is_staff=True, is_superuser=True)
    providers = [provider_user() for _ in range(8)]
    for p in providers:
        earn(p, "100", at=timezone.now() - timedelta(days=10))
    requested = [payouts.payout_request(provider=p, amount=D("45")) for p in providers]
    results = race(lambda p: payouts.payout_approve(payout_id=p.pk, by=op), requested)
    assert all(isinstance(r, Payout) and r.state == Payout.State.PAID for r in results)
    assert all(earnings(p) == D("45") for p in providers)
    assert ledger_check() == []


def test_the_database_refuses_a_second_open_payout_that_bypasses_the_service():
    provider = provider_user()
    Payout.objects.create(provider=provider, amount=D("20"))
    with pytest.raises(IntegrityError), transaction.atomic():
        Payout.objects.create(provider=provider, amount=D("20"), state=Payout.State.APPROVED)
    Payout.objects.create(provider=provider, amount=D("20"), state=Payout.State.PAID)  # closed ones are fine
