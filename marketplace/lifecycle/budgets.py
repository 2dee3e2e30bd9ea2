"""Project budgets (Project.monthly_budget, UTC calendar months) and what a hard cap does (docs/payments.md,
"Budgets"). A soft cap does nothing here: the spend alerts at 50/80/100% do the talking.

A hard-capped project's money at an instant is its month-to-date spend (statements.project_spend: what its
statement totals) plus what its pay-as-you-go leases hold:

- an on-demand or spot lease that is provisioning or running holds what it owes and the ledger has not charged
  yet (metering.owed) plus its next MIN_PREPAID_SECONDS at its price — the same stretch the wallet check asks an
  order to cover, and longer than a metering period (a minute), so no order can slip in between two postings;
- a reserved window and a resale purchase are paid when booked: once placed they are in the spend.

An order is placed only if the project stays within its budget after it: `cap_lock` takes the project's row lock
at the start of the order's transaction, `cap_check` reads the project again after the placement, in the same
transaction, and refuses (rolling the placement back) when it would pass the cap. The meter's tick
(`caps_reached`) tells a project BUDGET_NOTICE_SECONDS before its running leases reach the cap at their burn rate,
and at the cap ends them through the lifecycle's one transition (leases.meter_tick does both).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction

from marketplace import events
from marketplace import metering
from marketplace.amounts import ZERO, cost, micro, usd
from marketplace.conf import market
from marketplace.models import BudgetNotice, Lease, Mode, Project
from marketplace.money.statements import month_of, project_spend, projects_spend
from scheduler.errors import Conflict

PAY_AS_YOU_GO = (Mode.ON_DEMAND, Mode.SPOT)
HOLDING_STATES = (Lease.State.PROVISIONING, Lease.State.RUNNING)


class OverBudget(Conflict):
    def __init__(self, message: str, **kw):
        super().__init__(message, code="over_budget", **kw)


@dataclass(frozen=True)
class BudgetState:
    """A project's month so far: its budget, what it spent, what its open leases hold, what is left."""

    project_id: int
    name: str
    month: str
    budget: Decimal | None
    cap: str
    spent: Decimal
    held: Decimal

    @property
    def used(self) -> Decimal:
        return self.spent + self.held

    @property
    def left(self) -> Decimal | None:
        return None if self.budget is None else self.budget - self.used

    @property
    def share(self) -> Decimal | None:
        """Spent as a share of the budget (0.5 = half), for the console's bar and the spend alerts."""
        return None if not self.budget else self.spent / self.budget


def _pay_as_you_go(project_ids: list[int]):
    return Lease.objects.filter(order__project_id__in=project_ids, state__in=HOLDING_STATES, mode__in=PAY_AS_YOU_GO,
                                metered=True)


def held_by_leases(*, project_id: int, now: datetime) -> Decimal:
    """What the project's provisioning and running on-demand and spot leases hold against its budget: what they owe
    uncharged, and their next MIN_PREPAID_SECONDS at their price."""
    seconds = market("MIN_PREPAID_SECONDS")
    return sum((metering.owed(lease, now) + cost(per_hour=lease.price_per_hour, seconds=seconds)
                for lease in _pay_as_you_go([project_id]).only(
                    "id", "state", "metered", "price_per_hour", "accrued_until", "cost_accrued", "cost_charged",
                    "ends_at")), ZERO)


def budget_state(*, project: Project, now: datetime) -> BudgetState:
    """The project's month so far (a selector)."""
    return BudgetState(project_id=project.pk, name=project.name, month=month_of(now), budget=project.monthly_budget,
                       cap=project.budget_cap, spent=project_spend(project_id=project.pk, at=now),
                       held=held_by_leases(project_id=project.pk, now=now))


def cap_lock(*, project_id, now: datetime) -> BudgetState | None:
    """At the start of an order's transaction: lock a hard-capped project's row and read its month; None when the
    order has no project or its project has no hard cap (nothing to check)."""
    if project_id in (None, ""):
        return None
    # Lock the project: the race is two orders of one project placed at once, each reading the spend before the
    # other's lease or charge is committed and both passing the cap. The second waits here until the first commits,
    # then reads it.
    project = (Project.objects.select_for_update().filter(pk=project_id, budget_cap=Project.BudgetCap.HARD,
                                                          monthly_budget__isnull=False).first())
    return budget_state(project=project, now=now) if project is not None else None


def cap_check(*, before: BudgetState | None, now: datetime) -> None:
    """After an order's placement, in its transaction (under cap_lock's lock): OverBudget, which rolls the
    placement back, when the project would pass its cap."""
    if before is None:
        return
    project = Project(pk=before.project_id, name=before.name, monthly_budget=before.budget, budget_cap=before.cap)
    after = budget_state(project=project, now=now)
    if after.used <= before.budget:
        return
    needs = after.used - before.used
    raise OverBudget(
        f"Project {before.name} has {usd(max(ZERO, before.left))} left of its {usd(before.budget)} monthly budget "
        f"(a hard cap) and this order needs {usd(needs)}: raise the budget or make it a soft cap.",
        field="project", details={"project": before.project_id, "budget": str(before.budget),
                                  "left": str(micro(max(ZERO, before.left))), "needed": str(micro(needs))})


@dataclass
class CapReached:
    """What the tick found for one hard-capped project: a notice to send, or its leases to end."""

    project: Project
    kind: str  # BudgetNotice.Kind
    spent: Decimal
    burn_per_hour: Decimal
    seconds_left: float
    leases: list = field(default_factory=list)


def caps_reached(*, now: datetime) -> list[CapReached]:
    """Hard-capped projects whose running pay-as-you-go leases reach the cap within BUDGET_NOTICE_SECONDS at their
    burn rate (kind 'notice') or have reached it (kind 'stopped', with the leases to end). Spend here is what the
    ledger charged plus what the leases owe uncharged; the hold of a new order is not counted (nothing new)."""
    out = []
    notice_s = market("BUDGET_NOTICE_SECONDS")
    projects = (Project.objects.filter(budget_cap=Project.BudgetCap.HARD, monthly_budget__isnull=False,
                                       orders__leases__state=Lease.State.RUNNING,
                                       orders__leases__mode__in=PAY_AS_YOU_GO).distinct().select_related("user"))
    projects = list(projects)
    running: dict[int, list[Lease]] = {}
    for lease in _pay_as_you_go([p.pk for p in projects]).filter(state=Lease.State.RUNNING).select_related("order"):
        running.setdefault(lease.order.project_id, []).append(lease)
    spends = projects_spend(project_ids=[p.pk for p in projects], at=now)
    for project in projects:
        leases = running.get(project.pk, [])
        burn = sum((lease.price_per_hour for lease in leases), ZERO)
        spent = spends[project.pk] + sum((metering.owed(lease, now) for lease in leases), ZERO)
        left = project.monthly_budget - spent
        seconds_left = float(left / burn * 3600) if burn > 0 else float("inf")
        if left <= 0:
            out.append(CapReached(project, "stopped", spent, burn, 0.0, [lease.pk for lease in leases]))
        elif seconds_left <= notice_s:
            out.append(CapReached(project, "notice", spent, burn, seconds_left))
    return out


def cap_notice(reached: CapReached, *, now: datetime) -> bool:
    """Say once per project, month and kind (BudgetNotice) that the cap is near or reached: the account's webhook
    (kind "budget"), an e-mail and the console. False when it was said already this month."""
    project = reached.project
    month = month_of(now)
    try:
        with transaction.atomic():
            BudgetNotice.objects.create(project=project, month=month, kind=reached.kind, budget=project.monthly_budget,
                                        spent=reached.spent, at=now)
    except IntegrityError:  # said already (this tick's twin on another beat worker, or an earlier tick)
        return False
    ends_in = int(reached.seconds_left)
    event = {"type": "budget_cap", "kind": reached.kind, "project": {"id": project.pk, "name": project.name},
             "month": month, "budget": str(project.monthly_budget), "spent": str(reached.spent),
             "burn_per_hour": str(reached.burn_per_hour), "ends_in_seconds": ends_in}
    if reached.kind == BudgetNotice.Kind.NOTICE:
        subject = f"Project {project.name} reaches its monthly budget in about {max(1, ends_in // 60)} minutes"
        body = (f"Project {project.name} has spent {usd(reached.spent)} of its {usd(project.monthly_budget)} budget "
                f"for {month} and its leases burn {usd(reached.burn_per_hour)} an hour. Its budget is a hard cap: at "
                f"the cap its on-demand and spot leases end and new orders are refused. Raise the budget or make it "
                f"a soft cap on the project's page to keep them running.")
    else:
        subject = f"Project {project.name} reached its monthly budget: its leases were ended"
        body = (f"Project {project.name} has spent {usd(reached.spent)} of its {usd(project.monthly_budget)} budget "
                f"for {month}, a hard cap: its on-demand and spot leases were ended and new orders are refused until "
                f"the budget is raised or the month ends. Reserved windows, paid already, go on.")
    # One notice, three ways. The bell has the project's spend alert already (alerts' default rule: 50/80/100% of
    # every budget, soft or hard), so this adds what only a hard cap has: the warning before leases end.
    events.tell_buyer(project.user_id, {**event, "message": subject})
    events.notify_webhook(user_id=project.user_id, kind="budget", payload=event)
    if project.user.email:
        events.mail_later(to=project.user.email, subject=subject, body=body)
    return True

