"""A buyer sets a project's monthly budget in the console: a value with too many decimals is refused beside the
field, a hard cap at $250.50 is saved and the project's month shows what is left."""
from __future__ import annotations

import re

import pytest

from tests.browser.conftest import login, screenshot

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
