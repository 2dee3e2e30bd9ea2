"""A project's hard cap under concurrency on PostgreSQL: orders of one project racing past its budget on their own
connections — the project's row lock lets at most the ones the budget covers through."""
from __future__ import annotations

import threading
from decimal import Decimal

import pytest

from marketplace.lifecycle import budgets
from marketplace.models import Lease, Order
from marketplace.money.check import ledger_check
from marketplace.products import orders, projects
from marketplace.products.orders import OrderSpec
from tests.factories import UserFactory
from tests.marketplace.marketsim import Fleet, top_up
from tests.marketplace.test_market_concurrency import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_orders_racing_past_a_hard_cap_place_at_most_one(monkeypatch):
    # Two models on two nodes: the orders claim different GPUs, so no GPU lock orders them; only the project's can.
    fleet = Fleet()
    fleet.node("l4:4", price="2.00")
    fleet.node("a10:4", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    # Each order holds its first 10 minutes: $0.60 (L4: 1.8 x $2.00 an hour) and a bit more on the A10 (its
    # price); $1.00 covers one, not two.
    project = projects.project_create(user=buyer, name="vision", monthly_budget="1.00", budget_cap="hard")
    # Both orders reach the budget check together (a barrier just before the project's lock), so that each reads
    # the project while the other is placing: without the lock both would pass.
    lock = budgets.cap_lock
    at_the_check = threading.Barrier(2, timeout=30)

    def together(**kw):
        at_the_check.wait()
        return lock(**kw)

    monkeypatch.setattr(budgets, "cap_lock", together)
    for _ in range(4):  # a few rounds, each two orders at once
        at_the_check.reset()
        Lease.objects.filter(order__project=project).update(state=Lease.State.ENDED)
        results = race(lambda model: orders.order_place(buyer=buyer, spec=OrderSpec(
            mode="on_demand", gpu_models=[model], project_id=project.pk)), ["l4", "a10"], workers=2)
        placed = [r for r in results if isinstance(r, Order)]
        refused = [r for r in results if isinstance(r, budgets.OverBudget)]
        assert (len(placed), len(refused)) == (1, 1), results
        assert "left of its $1.00 monthly budget" in refused[0].message


def test_eight_orders_racing_for_a_budget_that_covers_three_place_three():
    Fleet().node("l4:8", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    project = projects.project_create(user=buyer, name="vision", monthly_budget="1.80", budget_cap="hard")
    results = race(lambda i: orders.order_place(buyer=buyer, spec=OrderSpec(
        mode="on_demand", gpu_models=["l4"], project_id=project.pk)), list(range(8)), workers=8)
    assert sum(isinstance(r, Order) for r in results) == 3
    assert sum(isinstance(r, budgets.OverBudget) for r in results) == 5
    state = budgets.budget_state(project=project, now=Order.objects.latest("created_at").created_at)
    assert state.held == Decimal("1.80") and state.left == 0
    assert ledger_check() == []
