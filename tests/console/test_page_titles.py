"""Every console page has a plain-text title (a template slip once put a whole section into one)."""
from __future__ import annotations

import re

import pytest

from tests.factories import ProviderFactory, UserFactory

pytestmark = pytest.mark.django_db

PAGES = ["/alerts/", "/alerts/rules/", "/nodes/", "/nodes/register/", "/catalog/", "/leases/", "/reservations/", "/resale/", "/billing/",
         "/account/", "/earnings/", "/provider/", "/password/change/"]


@pytest.mark.parametrize("path", PAGES)
def test_each_page_has_a_plain_text_title(client, path):
    client.force_login(ProviderFactory())
    r = client.get(path)
    assert r.status_code == 200
    title = re.search(r"<title>(.*?)</title>", r.content.decode(), re.S).group(1)
    assert "<" not in title and title.strip().endswith("· GPU Market") and len(title) < 80


def test_no_template_comment_is_left_raw_in_any_template():
    """Django's {# #} comments are one line: one spread over two lines is printed on the page as it is."""
    from tests.conftest import ROOT

    raw = [f"{p.relative_to(ROOT)}:{n}" for p in (ROOT / "templates").rglob("*.html")
           for n, line in enumerate(p.read_text().splitlines(), 1) if "{#" in line and "#}" not in line]
    assert raw == []


def test_a_lease_page_shows_no_template_syntax(client):
    from marketplace.products.orders import OrderSpec, order_place
    from tests.marketplace.marketsim import Fleet, top_up

    Fleet().node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "10")
    lease = order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True)).leases.get()
    client.force_login(buyer)
    html = client.get(f"/leases/{lease.pk}/").content.decode()
    assert "Connection" in html and not re.search(r"\{[#%{]|[#%}]\}", html)
