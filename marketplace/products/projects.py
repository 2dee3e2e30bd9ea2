"""A buyer's projects: named groups for orders, usage and statements; a name is unique per buyer; each may have a
monthly budget, a soft or a hard cap (lifecycle/budgets.py)."""
from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError, RestrictedError
from django.utils import timezone

from marketplace.amounts import CENT, money, usd
from marketplace.models import BudgetNotice, Project, UsageRecord
from marketplace.money.statements import month_of
from scheduler.errors import Conflict, DomainError


def _clean_name(name) -> str:
    name = (name or "").strip() if isinstance(name, str) else ""
    if not name or len(name) > 80:
        raise DomainError("a project needs a name of 1 to 80 characters", field="name")
    return name


def project_create(*, user, name: str, description: str = "", monthly_budget=None,
                   budget_cap: str = Project.BudgetCap.SOFT) -> Project:
    """Create a project (with a budget, if given); refuses a name the user already has."""
    name = _clean_name(name)
    amount = budget_amount(monthly_budget)
    _cap_checked(budget_cap)
    try:
        with transaction.atomic():
            return Project.objects.create(user=user, name=name, description=(description or "")[:400],
                                          monthly_budget=amount, budget_cap=budget_cap)
    except IntegrityError:  # the unique (user, name) constraint also covers two creates at once
        raise Conflict(f"you already have a project named {name!r}", field="name") from None


KEEP = object()  # project_update: leave the budget as it is


def project_update(*, project: Project, name: str | None = None, description: str | None = None,
                   monthly_budget=KEEP, budget_cap: str | None = None) -> Project:
    """Rename or re-describe a project (the name stays unique per user), or change its budget
    (project_budget_set)."""
    if monthly_budget is not KEEP or budget_cap is not None:
        project = project_budget_set(
            project=project, monthly_budget=project.monthly_budget if monthly_budget is KEEP else monthly_budget,
            budget_cap=budget_cap or project.budget_cap)
    if name is not None:
        project.name = _clean_name(name)
    if description is not None:
        project.description = description[:400]
    try:
        with transaction.atomic():
            project.save(update_fields=["name", "description"])
    except IntegrityError:
        raise Conflict(f"you already have a project named {project.name!r}", field="name") from None
    return project


def project_delete(*, project: Project) -> None:
    """Delete a project that nothing was billed to; statements must keep their grouping."""
    if UsageRecord.objects.filter(project=project).exists() or project.transactions.exists() or project.entries.exists():
        raise Conflict("this project has usage or charges on record and cannot be deleted; rename it instead",
                       code="project_in_use")
    try:
        with transaction.atomic():
            project.delete()
    except (ProtectedError, RestrictedError):  # another model (e.g. an order) protects it
        raise Conflict("this project is used by orders and cannot be deleted", code="project_in_use") from None


BUDGET_MAX = Decimal("9999999999.99")  # Project.monthly_budget: 12 digits, 2 places


def budget_amount(value) -> Decimal | None:
    """A monthly budget as entered: empty for none, else a positive amount of whole cents (USD)."""
    if value in (None, ""):
        return None
    try:
        amount = money(value.strip() if isinstance(value, str) else value, field="monthly_budget")
    except (DomainError, TypeError):
        raise DomainError("a budget is an amount in USD with at most 2 decimals, e.g. 250.50",
                          field="monthly_budget") from None
    if amount != amount.quantize(CENT):
        raise DomainError("a budget is an amount in USD with at most 2 decimals, e.g. 250.50", field="monthly_budget")
    if not (Decimal("0") < amount <= BUDGET_MAX):
        raise DomainError(f"a budget is more than $0 and at most {usd(BUDGET_MAX)}", field="monthly_budget")
    return amount.quantize(CENT)


def _cap_checked(budget_cap: str) -> None:
    if budget_cap not in Project.BudgetCap.values:
        raise DomainError("a budget's cap is 'soft' (alerts only) or 'hard' (refuse and stop at the cap)",
                          field="budget_cap")


def project_budget_set(*, project: Project, monthly_budget, budget_cap: str, now: datetime | None = None) -> Project:
    """Set (or clear, with None) a project's monthly budget and whether it is a soft or a hard cap. A changed budget
    may be warned about again this month: its notices of this month are forgotten."""
    amount = budget_amount(monthly_budget)
    _cap_checked(budget_cap)
    now = now or timezone.now()
    with transaction.atomic():
        # Lock the project: an order of it checks the cap under this lock; it sees the old budget or the new.
        Project.objects.select_for_update().filter(pk=project.pk).first()
        project.monthly_budget, project.budget_cap = amount, budget_cap
        project.save(update_fields=["monthly_budget", "budget_cap"])
        BudgetNotice.objects.filter(project=project, month=month_of(now)).delete()
    return project
