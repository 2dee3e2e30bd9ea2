"""Fixtures of the console tests."""
from __future__ import annotations

import pytest

from tests.factories import UserFactory


@pytest.fixture
def buyer(client):
    """A buyer signed in on the test client."""
    user = UserFactory(username="ann")
    client.force_login(user)
    return user
