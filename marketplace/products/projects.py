"""A buyer's projects: named groups for orders, usage and statements; a name is unique per buyer."""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError, RestrictedError

from marketplace.models import Project, UsageRecord
from scheduler.errors import Conflict, DomainError


def _clean_name(name) -> str:
    name = (name or "").strip() if isinstance(name, str) else ""
    if not name or len(name) > 80:
        raise DomainError("a project needs a name of 1 to 80 characters", field="name")
    return name


def project_create(*, user, name: str, description: str = "") -> Project:
    """Create a project; refuses a name the user already has."""
    name = _clean_name(name)
    try:
        with transaction.atomic():
            return Project.objects.create(user=user, name=name, description=(description or "")[:400])
    except IntegrityError:  # the unique (user, name) constraint also covers two creates at once
        raise Conflict(f"you already have a project named {name!r}", field="name") from None


def project_update(*, project: Project, name: str | None = None, description: str | None = None) -> Project:
    """Rename or re-describe a project; the name stays unique per user."""
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
