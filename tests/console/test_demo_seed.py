"""The demo's seed: accounts, nodes with fresh tokens, and the buyer's welcome credit, all idempotent."""
from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from marketplace.money import ledger
from marketplace.money.check import ledger_check
from marketplace.products.demo import DEMO_BUYER_CREDIT, DEMO_NODES, demo_seed
from scheduler.services.nodes import node_for_token

pytestmark = pytest.mark.django_db


def test_seeding_twice_gives_fresh_tokens_and_credits_the_buyer_once():
    first = demo_seed()
    second = demo_seed()
    assert [n.name for _, n, _ in second] == [s.name for s in DEMO_NODES]
    for (_, node, old), (_, _, new) in zip(first, second):
        assert node_for_token(token=old) is None and node_for_token(token=new) == node
    buyer = get_user_model().objects.get(username="buyer")
    assert ledger.wallet_balance(user=buyer) == DEMO_BUYER_CREDIT == Decimal("25.00")
    assert ledger_check() == []
