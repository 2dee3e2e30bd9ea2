"""Every console page has a plain-text title (a template slip once put a whole section into one)."""
from __future__ import annotations

import re

import pytest

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

PAGES = ["/nodes/", "/nodes/register/", "/catalog/", "/leases/", "/reservations/", "/resale/", "/billing/",
         "/account/"]


@pytest.mark.parametrize("path", PAGES)
def test_each_page_has_a_plain_text_title(client, path):
    client.force_login(UserFactory())
    r = client.get(path)
    assert r.status_code == 200
    title = re.search(r"<title>(.*?)</title>", r.content.decode(), re.S).group(1)
    assert "<" not in title and title.strip().endswith("· GPU Market") and len(title) < 80
