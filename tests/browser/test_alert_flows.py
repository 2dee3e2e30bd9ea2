"""Alerts in the browser: a buyer sets the wallet-runway rule on the rules page, leaves the alerts page open, orders
a slice their wallet pays for only some hours, and sees the alert arrive live (the list and the bell), then resolve
after a top-up."""
from __future__ import annotations

import re

import pytest

from tests.browser.conftest import login, screenshot
from tests.browser.test_buyer_flows import top_up

pytestmark = pytest.mark.browser


def test_a_buyer_sets_a_rule_and_watches_a_wallet_alert_fire_live_and_resolve_after_a_top_up(
        stack, new_page, request):
    page = new_page()
    login(page, "buyer-dee")
    page.goto("/alerts/rules/")
    rule = page.locator("#rule-wallet_runway")
    assert rule.get_by_label("Runs out within (hours)").input_value() == "24"  # the seed's default
    rule.get_by_label("Runs out within (hours)").fill("9999")
    rule.get_by_role("button", name="Save").click()
    page.locator("#rule-wallet_runway .error", has_text="720").wait_for()  # refused beside the field
    rule = page.locator("#rule-wallet_runway")
    rule.get_by_label("Runs out within (hours)").fill("500")
    rule.get_by_role("button", name="Save").click()
    page.locator(".flash", has_text="rule saved").wait_for()
    assert page.locator("#rule-wallet_runway").get_by_label("Runs out within (hours)").input_value() == "500"
    screenshot(page, request, "-rules")

    top_up(page, "5.00")
    alerts_page = new_page()
    login(alerts_page, "buyer-dee")
    alerts_page.goto("/alerts/")
    alerts_page.locator("#alerts-live", has_text="live").wait_for()
    assert alerts_page.locator("#no-firing").is_visible()

    # $5 at 1.8 x 2.00/h x 1/7 = $0.5143/h lasts under 10 hours: far inside the 500-hour rule.
    page.goto("/catalog/")
    page.locator('tr[data-unit="h100-80gb:1g.10gb:eu-west"]').get_by_role("link", name="Order").click()
    page.wait_for_url(re.compile(r"/order/\?"))
    page.wait_for_load_state()
    page.get_by_label("Duration (hours)").fill("2")
    page.get_by_role("button", name="Place order").click()
    page.wait_for_url(re.compile(r"/leases/[0-9a-f-]+/$"))
    page.locator("#lease-state", has_text="running").wait_for()

    card = alerts_page.locator("article.alert-card[data-kind='wallet_runway']")
    card.wait_for()  # live: the page was not reloaded
    assert "runs out in about" in card.inner_text()
    alerts_page.locator("#alert-bell .count", has_text="1").wait_for()
    screenshot(alerts_page, request)

    top_up(page, "2000.00")  # enough for more than 500 hours
    alerts_page.locator("#no-firing").wait_for()
    alerts_page.locator("#resolved-h ~ article.alert-card[data-kind='wallet_runway']").wait_for()
    assert alerts_page.locator("#alert-bell .count").count() == 0
    screenshot(alerts_page, request, "-resolved")
