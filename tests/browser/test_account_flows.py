"""A new visitor signs up in the browser, confirms the address from the mail the stack sent to a local SMTP server,
logs in, tops up with the local fake Stripe, orders a MIG slice and sees its lease run."""
from __future__ import annotations

import re

import pytest

from tests.browser.conftest import screenshot
from tests.browser.test_buyer_flows import top_up
from tests.mailserver import link_in

pytestmark = pytest.mark.browser


def test_a_new_visitor_signs_up_confirms_the_email_tops_up_orders_and_sees_the_lease(stack, new_page, request):
    page = new_page()
    page.goto("/")
    page.get_by_role("link", name="Sign up", exact=True).click()
    page.get_by_label("Username").fill("newcomer")
    page.get_by_label("E-mail").fill("Newcomer@Example.org")
    page.get_by_label("Password", exact=True).fill("a-good-long-password")
    page.get_by_label("Password again").fill("a-good-long-password")
    page.get_by_role("button", name="Create account").click()
    page.locator("#signup-sent", has_text="Newcomer@example.org").wait_for()

    # Not active before the link: the right password says so.
    page.goto("/login/")
    page.get_by_label("Username").fill("newcomer")
    page.get_by_label("Password").fill("a-good-long-password")
    page.get_by_role("button", name="Log in").click()
    page.locator("#login-error", has_text="Confirm your e-mail address first").wait_for()

    # The mail, as the SMTP server received it; its link, and the one button on its page.
    message = stack.mailbox.wait_for("Newcomer@example.org", subject="Confirm your e-mail")
    page.goto(link_in(message, "/signup/confirm/"))
    page.get_by_role("button", name="Confirm my e-mail address").click()
    page.wait_for_url(re.compile(r"/login/\?username=newcomer$"))
    assert "Your e-mail address is confirmed" in page.locator(".flash").inner_text()
    assert page.get_by_label("Username").input_value() == "newcomer"
    page.get_by_label("Password").fill("a-good-long-password")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"/catalog/$"))
    assert page.locator(".who span").inner_text() == "newcomer"

    top_up(page, "10.00")
    assert page.locator("#balance").inner_text() == "$10.00"

    page.get_by_role("link", name="Catalog").click()
    page.locator('tr[data-unit="h100-80gb:1g.10gb:eu-west"]').get_by_role("link", name="Order").click()
    page.wait_for_url(re.compile(r"/order/\?"))
    page.wait_for_load_state()
    page.get_by_label("Duration (hours)").fill("1")
    page.wait_for_function("() => (document.getElementById('quote-total') || {}).textContent === '$0.51'")
    page.get_by_role("button", name="Place order").click()
    page.wait_for_url(re.compile(r"/leases/[0-9a-f-]+/$"))
    page.locator("#lease-state", has_text="running").wait_for()
    assert page.locator("#cuda-env").inner_text().startswith("CUDA_VISIBLE_DEVICES=MIG-")
    screenshot(page, request)
    page.get_by_role("link", name="My leases", exact=True).click()
    page.locator("main table", has_text="running").first.wait_for()
