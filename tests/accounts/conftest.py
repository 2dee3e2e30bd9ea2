"""Fixtures of the accounts tests: a real SMTP server that Django's SMTP backend sends to, and a clean slate of the
per-address throttles (they count in the shared cache, which outlives each test's database). The test settings
raise the address limits out of the way of other tests; tests here set the numbers they check."""
from __future__ import annotations

import pytest

from tests.mailserver import smtp_server


@pytest.fixture
def smtp(settings):
    """Django sends through its SMTP backend to a local SMTP server; the fixture is its mailbox."""
    with smtp_server() as (box, port):
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
        settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
        settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
        yield box


@pytest.fixture(autouse=True)
def _fresh_throttles(monkeypatch):
    """Each test counts in throttle keys of its own (the cache is shared by the whole run, Redis by every run)."""
    import uuid

    from marketplace.products.accounts.throttle import AddressThrottle

    run = uuid.uuid4().hex[:12]
    monkeypatch.setattr(AddressThrottle, "_key",
                        lambda self, address, index: f"accounts-throttle-test:{run}:{self.kind}:{address}:{index}")
