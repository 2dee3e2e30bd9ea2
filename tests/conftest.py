"""Shared fixtures. Core tests need no database; fleet tests use it; `postgres` tests need PostgreSQL."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The real container engine and the test images, for tests/engine and the browser's workload flow.
from tests.enginefix import busybox_image, engine, engine_node, engine_url, sshd_image  # noqa: F401
from tests.mailserver import smtp_server
# localstripe for the session (`fake_stripe`, `stripe_on`) and a local webhook receiver (`hook_url`).
from tests.stripefake import fake_stripe, stripe_on  # noqa: F401
from tests.webhookserver import hook_url  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    on_postgres = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
    skip_pg = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL=postgres://... (CI does)")
    for item in items:
        if "postgres" in item.keywords and not on_postgres:
            item.add_marker(skip_pg)
    # Playwright's sync API keeps an event loop running in the main thread while its browser is open,
    # which asyncio tests cannot share: browser tests run last.
    items.sort(key=lambda item: "browser" in item.keywords)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that ran a live stack (e2e, faults, browser) carries the logs of the stack's processes."""
    from tests.e2e.livestack import LiveStack

    report = yield
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, LiveStack):
                report.sections.append((f"logs of the processes of `{name}`", value.logs()))
    return report


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture(autouse=True)
def _gpu_catalog(request):
    """Transactional tests flush the tables between tests, the seeded catalog with them: put it back."""
    marker = request.node.get_closest_marker("django_db")
    if marker and (marker.kwargs.get("transaction") or (marker.args and marker.args[0])):
        from scheduler.services.catalog import catalog_sync

        request.getfixturevalue("django_db_setup")
        catalog_sync()


@pytest.fixture(autouse=True)
def _ledger_account_ids(request):
    """The ledger remembers account ids once their transaction commits; a test that ran its on-commit callbacks
    inside its rolled-back transaction leaves ids of rows that are gone (the ledger then resolves them again, which
    costs the next test's query counts a lookup each). Forget them after every database test."""
    yield
    if request.node.get_closest_marker("django_db"):
        from marketplace.money.ledger import forget_account_ids

        forget_account_ids()


@pytest.fixture
def fleet():
    """Nodes whose simulated agents answer when a test plays them (tests/marketplace/marketsim.py)."""
    from tests.marketplace.marketsim import Fleet

    return Fleet()


@pytest.fixture
def smtp(settings):
    """Django sends through its SMTP backend to a local SMTP server; the fixture is its mailbox."""
    with smtp_server() as (box, port):
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
        settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
        settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
        yield box
