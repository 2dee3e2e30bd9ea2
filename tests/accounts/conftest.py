"""Fixtures of the accounts tests: a clean slate of the per-address throttles (they count in the shared cache, which outlives each test's database). The test settings
raise the address limits out of the way of other tests; tests here set the numbers they check."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_throttles(monkeypatch):
    """Each test counts in throttle keys of its own (the cache is shared by the whole run, Redis by every run)."""
    import uuid

    from marketplace.products.accounts.throttle import AddressThrottle

    run = uuid.uuid4().hex[:12]
    monkeypatch.setattr(AddressThrottle, "_key",
                        lambda self, address, index: f"accounts-throttle-test:{run}:{self.kind}:{address}:{index}")
