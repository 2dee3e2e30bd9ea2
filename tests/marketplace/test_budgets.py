"""Project budgets: month-to-date spend (the statement's total), the hard cap on every order path, the notice before
the cap and the end of pay-as-you-go leases at it, budget editing through the API."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone as dt_timezone
from decimal import Decimal

import pytest
from django.core import mail
from django.utils import timezone

from marketplace import events, notifications
from marketplace.lifecycle import budgets, leases
from marketplace.models import BudgetNotice, Lease, Order, Project, Reservation
from marketplace.money import statements
from marketplace.products import orders, projects, resale
from marketplace.products.orders import OrderSpec
from tests.factories import UserFactory, client_for
from tests.marketplace.marketsim import top_up

pytestmark = pytest.mark.django_db

# An L4 at $2.00 base: on demand 1.8 x 2.00 = $3.60 an hour, so an order's first 10 minutes (MIN_PREPAID_SECONDS)
# hold $0.60 of its project's budget.
FIRST_TEN_MINUTES = Decimal("0.60")


def project_of(user, budget: str | None, cap: str = "hard", name: str = "vision") -> Project:
    return projects.project_create(user=user, name=name, monthly_budget=budget, budget_cap=cap)


def on_demand(buyer, project, now=None, **kw) -> Order:
    return orders.order_place(buyer=buyer, now=now, spec=OrderSpec(mode="on_demand", gpu_models=["l4"],
                                                                   project_id=project.pk, **kw))



def test_month_to_date_spend_is_what_the_projects_statement_totals(fleet):
    fleet.node("l4:2", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    project = project_of(buyer, None, "soft")
    lease = Lease.objects.get(order=on_demand(buyer, project))
    start = timezone.now() + timedelta(hours=3)
    orders.order_place(buyer=buyer, spec=OrderSpec(mode="reserved", gpu_models=["l4"], window_start=start,
                                                   window_end=start + timedelta(hours=1), project_id=project.pk))
    fleet.play()
    lease.refresh_from_db()
    t0 = lease.billed_until
    leases.meter_tick(now=t0 + timedelta(seconds=600))
    now = t0 + timedelta(seconds=601)
    spent = statements.project_spend(project_id=project.pk, at=now)
    total = next(p for p in statements.statement(user=buyer, month=statements.month_of(now))["projects"]
                 if p["project"] and p["project"]["id"] == project.pk)["total"]
    reservation = Reservation.objects.get().price_total
    lease.refresh_from_db()
    assert lease.cost_charged > 0
    assert spent == Decimal(total) == reservation + lease.cost_charged  # usage + the window; the top-up is not
    assert statements.project_spend(project_id=project.pk, at=now + timedelta(days=40)) == 0  # another month


@pytest.mark.parametrize("at, month", [
    (datetime(2026, 12, 31, 23, 59, 59, tzinfo=dt_timezone.utc), "2026-12"),
    (datetime(2027, 1, 1, 0, 30, tzinfo=dt_timezone(timedelta(hours=2))), "2026-12"),  # 22:30 UTC the day before
    (datetime(2027, 1, 1, 0, 0, tzinfo=dt_timezone.utc), "2027-01"),
])
def test_the_budget_month_is_the_utc_calendar_month(at, month):
    assert statements.month_of(at) == month


def test_a_hard_cap_refuses_an_order_whose_first_minutes_would_pass_it_and_writes_nothing(fleet):
    fleet.node("l4:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    project = project_of(buyer, "0.50")
    with pytest.raises(budgets.OverBudget) as refused:
        on_demand(buyer, project)
    assert refused.value.message.startswith("Project vision has $0.50 left of its $0.50 monthly budget")
    assert "needs $0.60" in refused.value.message and refused.value.status == 409
    assert not Order.objects.exists() and not Lease.objects.exists()


def test_a_soft_cap_refuses_nothing(fleet):
    fleet.node("l4:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    project = project_of(buyer, "0.50", "soft")
    assert on_demand(buyer, project).state == Order.State.PLACED


def test_each_running_lease_holds_its_next_minutes_so_a_second_order_is_refused(fleet):
    fleet.node("l4:2", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    project = project_of(buyer, "1.00")
    now = timezone.now()  # one instant: a lease owes from its placement, so a later reading holds a second more
    assert on_demand(buyer, project, now=now).state == Order.State.PLACED
    state = budgets.budget_state(project=project, now=now)
    assert (state.spent, state.held, state.left) == (0, FIRST_TEN_MINUTES, Decimal("0.40"))
    with pytest.raises(budgets.OverBudget, match=r"has \$0.40 left of its \$1.00 monthly budget"):
        on_demand(buyer, project)
    assert Lease.objects.count() == 1
    other = project_of(buyer, None, "soft", name="other")  # another project of the same buyer is not capped by it
    assert on_demand(buyer, other).state == Order.State.PLACED


def test_a_reserved_window_counts_its_whole_price_paid_when_booked(fleet):
    fleet.node("l4:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    project = project_of(buyer, "5.00")
    start = timezone.now() + timedelta(hours=3)
    spec = dict(mode="reserved", gpu_models=["l4"], window_start=start, project_id=project.pk)
    with pytest.raises(budgets.OverBudget, match=r"has \$5.00 left"):
        orders.order_place(buyer=buyer, spec=OrderSpec(window_end=start + timedelta(hours=3), **spec))
    assert not Reservation.objects.exists()
    orders.order_place(buyer=buyer, spec=OrderSpec(window_end=start + timedelta(hours=1), **spec))
    price = Reservation.objects.get().price_total
    assert budgets.budget_state(project=project, now=timezone.now()).spent == price


def test_a_queued_order_placed_later_past_the_cap_fails_with_the_budgets_words(fleet):
    node = fleet.node("l4:1", price="2.00")
    buyer, other = UserFactory(), UserFactory()
    top_up(buyer, "100")
    top_up(other, "100")
    first = orders.order_place(buyer=other, spec=OrderSpec(mode="on_demand", gpu_models=["l4"]))
    project = project_of(buyer, "1.00")
    queued = on_demand(buyer, project, if_unavailable="queue")
    assert queued.state == Order.State.QUEUED
    projects.project_budget_set(project=project, monthly_budget="0.50", budget_cap="hard")
    orders.order_cancel(buyer=other, order_id=first.pk)
    fleet.play()
    assert node.gpus.get().slices.filter(state="active").count() == 0
    orders.orders_retry()
    queued.refresh_from_db()
    assert queued.state == Order.State.FAILED and "left of its $0.50 monthly budget" in queued.explain


def test_the_tick_gives_notice_before_the_cap_once_then_ends_the_leases_at_it(fleet, settings, monkeypatch,
                                                                             django_capture_on_commit_callbacks):
    settings.MARKET = {**settings.MARKET, "BUDGET_NOTICE_SECONDS": 900.0}
    settings.WEBHOOKS_ALLOW_LOOPBACK = True
    posted = []
    monkeypatch.setattr(events, "run_task", lambda name, *args: posted.append((name, *args)))
    fleet.node("l4:1", price="2.00")
    buyer = UserFactory(email="lead@example.com")
    notifications.notification_settings_update(user=buyer, webhook_url="http://127.0.0.1:9/hook", budget=True)
    top_up(buyer, "100")
    project = project_of(buyer, "1.00")  # $3.60 an hour: 1,000 s of it
    lease = Lease.objects.get(order=on_demand(buyer, project))
    fleet.play()
    lease.refresh_from_db()
    t0 = lease.billed_until
    leases.meter_tick(now=t0 + timedelta(seconds=60))
    assert not BudgetNotice.objects.exists()  # $0.06 spent: 940 s left, more than the notice
    with django_capture_on_commit_callbacks(execute=True):
        leases.meter_tick(now=t0 + timedelta(seconds=120))  # 880 s left: the notice
        leases.meter_tick(now=t0 + timedelta(seconds=180))  # and only once
    hooks = [args for name, *args in posted if name == events.DELIVER_WEBHOOK]
    assert len(hooks) == 1 and hooks[0][0] == "http://127.0.0.1:9/hook"
    assert hooks[0][1]["type"] == "budget_cap" and hooks[0][1]["kind"] == "notice"
    assert hooks[0][1]["project"] == {"id": project.pk, "name": "vision"} and hooks[0][1]["ends_in_seconds"] == 880
    notice = BudgetNotice.objects.get()
    assert notice.kind == "notice" and notice.spent == Decimal("0.12")
    assert [m.subject for m in mail.outbox] == ["Project vision reaches its monthly budget in about 14 minutes"]
    assert mail.outbox[0].to == ["lead@example.com"] and "hard cap" in mail.outbox[0].body
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING
    with django_capture_on_commit_callbacks(execute=True):
        leases.meter_tick(now=t0 + timedelta(seconds=1000))  # $1.00 spent: at the cap
    lease.refresh_from_db()
    assert lease.state in (Lease.State.ENDING, Lease.State.ENDED) and lease.end_reason == "budget_cap"
    assert lease.cost_charged == Decimal("1.00")
    assert set(BudgetNotice.objects.values_list("kind", flat=True)) == {"notice", "stopped"}
    assert mail.outbox[-1].subject == "Project vision reached its monthly budget: its leases were ended"


def test_a_soft_capped_project_at_its_budget_keeps_running(fleet):
    fleet.node("l4:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    project = project_of(buyer, "0.10", "soft")
    lease = Lease.objects.get(order=on_demand(buyer, project))
    fleet.play()
    lease.refresh_from_db()
    leases.meter_tick(now=lease.billed_until + timedelta(seconds=600))
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING and not BudgetNotice.objects.exists()


def test_raising_the_budget_forgets_this_months_notices():
    buyer = UserFactory()
    project = project_of(buyer, "1.00")
    BudgetNotice.objects.create(project=project, month=statements.month_of(timezone.now()), kind="notice",
                                budget=Decimal("1"), spent=Decimal("0.9"), at=timezone.now())
    projects.project_budget_set(project=project, monthly_budget="2.00", budget_cap="hard")
    assert not BudgetNotice.objects.exists()


def test_the_projects_api_sets_and_shows_a_budget_and_refuses_bad_ones():
    buyer = UserFactory()
    c = client_for(buyer)
    pid = c.post("/api/v1/projects/", {"name": "vision", "monthly_budget": "100.00", "budget_cap": "hard"},
                 format="json").json()["id"]
    r = c.patch(f"/api/v1/projects/{pid}/", {"monthly_budget": "250.50"}, format="json")
    assert r.status_code == 200 and (r.json()["monthly_budget"], r.json()["budget_cap"]) == ("250.50", "hard")
    for bad in ("0", "-5", "12.345", "abc"):
        r = c.patch(f"/api/v1/projects/{pid}/", {"monthly_budget": bad}, format="json")
        assert r.status_code == 400 and "monthly_budget" in str(r.json()), bad
    assert c.patch(f"/api/v1/projects/{pid}/", {"budget_cap": "sometimes"}, format="json").status_code == 400
    budget = c.get(f"/api/v1/projects/{pid}/budget/").json()
    assert (budget["budget"], budget["cap"], Decimal(budget["spent"]), Decimal(budget["left"])) == (
        "250.50", "hard", 0, Decimal("250.50"))
    r = c.patch(f"/api/v1/projects/{pid}/", {"monthly_budget": None, "name": "vision-2"}, format="json")
    assert (r.json()["monthly_budget"], r.json()["name"]) == (None, "vision-2")
    assert client_for(UserFactory()).get(f"/api/v1/projects/{pid}/budget/").status_code == 404


@pytest.mark.parametrize("value, ok", [("100", True), ("0.01", True), ("9999999999.99", True), ("", True),
                                       ("0", False), ("-1", False), ("1.001", False), ("1e3x", False),
                                       ("10000000000", False)])
def test_a_budget_is_positive_whole_cents_or_none(value, ok):
    if ok:
        assert projects.budget_amount(value) == (Decimal(value) if value else None)
    else:
        with pytest.raises(projects.DomainError):
            projects.budget_amount(value)


def test_the_console_project_page_sets_a_budget_and_shows_the_month(client):
    buyer = UserFactory()
    other = UserFactory()
    project = project_of(buyer, None, "soft")
    client.force_login(buyer)
    page = client.get(f"/account/projects/{project.pk}/")
    assert page.status_code == 200 and b"Save budget" in page.content
    bad = client.post(f"/account/projects/{project.pk}/", {"monthly_budget": "12.345", "budget_cap": "hard"})
    assert bad.status_code == 400 and b'aria-invalid="true"' in bad.content
    ok = client.post(f"/account/projects/{project.pk}/", {"monthly_budget": "250.50", "budget_cap": "hard"})
    assert ok.status_code == 302
    project.refresh_from_db()
    assert (project.monthly_budget, project.budget_cap) == (Decimal("250.50"), "hard")
    page = client.get(ok.url)
    assert b"a hard cap at $250.50 a month" in page.content and b'id="left">$250.50' in page.content
    client.force_login(other)
    assert client.get(f"/account/projects/{project.pk}/").status_code == 302  # not theirs: back to the account


def test_a_resale_purchase_past_a_hard_cap_is_refused_and_the_listing_stays_open(fleet):
    fleet.node("l4:1", price="2.00")
    seller, buyer = UserFactory(), UserFactory()
    top_up(seller, "100")
    top_up(buyer, "100")
    start = timezone.now() + timedelta(hours=3)
    orders.order_place(buyer=seller, spec=OrderSpec(mode="reserved", gpu_models=["l4"], window_start=start,
                                                    window_end=start + timedelta(hours=2)))
    listing = resale.listing_create(seller=seller, reservation_id=Reservation.objects.get().pk, starts_at=start,
                                    ends_at=start + timedelta(hours=1), ask_per_hour=Decimal("1.50"))
    project = project_of(buyer, "1.00")
    spec = OrderSpec(mode="resale", listing_id=listing.pk, project_id=project.pk)
    with pytest.raises(budgets.OverBudget, match=r"has \$1.00 left .* needs \$1.50"):
        orders.order_place(buyer=buyer, spec=spec)
    listing.refresh_from_db()
    assert listing.state == "open" and not Order.objects.filter(buyer=buyer).exists()
    projects.project_budget_set(project=project, monthly_budget="2.00", budget_cap="hard")
    assert orders.order_place(buyer=buyer, spec=spec).state == Order.State.PLACED
    assert budgets.budget_state(project=project, now=timezone.now()).spent == Decimal("1.50")


def test_the_orders_api_refuses_an_order_past_a_hard_cap_with_409_over_budget(fleet):
    fleet.node("l4:1", price="2.00")
    buyer = UserFactory()
    top_up(buyer, "100")
    project = project_of(buyer, "0.50")
    r = client_for(buyer).post("/api/v1/orders/", {"mode": "on_demand", "gpu_models": ["l4"], "project": project.pk},
                               format="json")
    assert r.status_code == 409 and r.json()["error"]["code"] == "over_budget"
    assert r.json()["error"]["details"] == {"project": project.pk, "budget": "0.50", "left": "0.500000", "needed": "0.600000"}
    assert "has $0.50 left of its $0.50 monthly budget" in r.json()["error"]["message"]
