"""A buyer sets a project's monthly budget in the console: a value with too many decimals is refused beside the
field, a hard cap at $250.50 is saved and the project's month shows what is left. Another saves a card with Stripe.js
(a SetupIntent, on the local fake Stripe) and turns auto top-up on: the beat's meter tick fills the empty wallet."""
from __future__ import annotations

import re
import time

import pytest

from tests.browser.conftest import PASSWORD, login, screenshot
from tests.browser.test_buyer_flows import GOOD_CARD

pytestmark = pytest.mark.browser


def test_a_buyer_sets_a_hard_monthly_budget_on_a_project(new_page, request):
    page = new_page()
    login(page, "buyer-cat")
    page.goto("/account/#projects")
    page.get_by_label("Project name").fill("budget-vision")
    page.get_by_role("button", name="Create project").click()
    page.locator("#project-list").get_by_role("link", name="budget-vision", exact=True).click()
    page.wait_for_url(re.compile(r"/account/projects/\d+/$"))
    assert page.locator("#left").inner_text() == "none"

    page.get_by_label("Monthly budget (USD)").fill("12.345")
    page.get_by_label("Hard cap —").check()
    page.get_by_role("button", name="Save budget").click()
    error = page.locator("#id_monthly_budget_error")
    error.wait_for()
    assert "2 decimal places" in error.inner_text()
    assert page.get_by_label("Monthly budget (USD)").get_attribute("aria-invalid") == "true"

    page.get_by_label("Monthly budget (USD)").fill("250.50")
    page.get_by_role("button", name="Save budget").click()
    page.locator(".flash", has_text="a hard cap at $250.50 a month").wait_for()
    assert page.locator("#left").inner_text() == "$250.50"
    assert page.locator("#spent").inner_text() == "$0.00"
    assert page.get_by_label("Hard cap —").is_checked()
    assert page.get_by_role("progressbar").get_attribute("aria-valuenow") == "0"
    screenshot(page, request)
    page.goto("/account/#projects")
    assert "$250.50 (hard cap)" in page.locator("#project-list").inner_text()


def test_a_buyer_saves_a_card_and_auto_top_up_fills_the_wallet(stack, new_page, request):
    stack.shell("from django.contrib.auth import get_user_model\n"
                f"get_user_model().objects.create_user('buyer-dot', password={PASSWORD!r})")
    page = new_page()
    login(page, "buyer-dot")
    page.goto("/billing/#auto-topup")
    assert page.locator("#auto-topup-card").inner_text() == "none saved"
    card = page.locator("#setup-card-element")
    card.locator('input[placeholder="number"]').fill(GOOD_CARD)
    card.locator('input[placeholder="exp_month"]').fill("12")
    card.locator('input[placeholder="exp_year"]').fill("34")
    card.locator('input[placeholder="cvc"]').fill("123")
    card.locator('input[placeholder="postal_code"]').fill("75001")
    page.get_by_role("button", name="Save card").click()
    page.locator(".flash", has_text="Card saved for auto top-up").wait_for()
    assert page.locator("#auto-topup-card").inner_text().endswith("•••• 4242")

    page.get_by_label("Top up automatically").check()
    page.get_by_label("When the wallet is under (USD)").fill("5.00")
    page.get_by_label("Add (USD)").fill("20.00")
    page.get_by_role("button", name="Save auto top-up").click()
    page.locator(".flash", has_text="Auto top-up is on: $20.00 whenever the wallet is under $5.00.").wait_for()
    # The wallet is empty, under the threshold: the beat's next meter tick charges the card off session.
    deadline = time.monotonic() + 45
    while page.locator("#balance").inner_text() != "$20.00":  # each look is a page load: no sleep
        assert time.monotonic() < deadline, "auto top-up did not fill the wallet"
        page.reload()
    assert page.locator("#balance").inner_text() == "$20.00"
    assert "Last attempt" in page.locator("#auto-topup").inner_text()
    screenshot(page, request)
