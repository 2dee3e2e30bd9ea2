"""In the browser: an API key made with the scopes its script needs (read and trade checked by default) works
within them; a provider renames a node and deletes it after confirming, and its running agent is told and stops."""
from __future__ import annotations

import shlex

import pytest

from tests.browser.conftest import login, screenshot
from tests.e2e.livestack import call_api, wait_until

pytestmark = pytest.mark.browser


def test_a_key_made_with_only_the_read_scope_reads_and_cannot_order(stack, new_page, request):
    page = new_page()
    login(page, "buyer-cat")
    page.goto("/account/")
    read = page.get_by_label("read: see your orders, leases, money, nodes and keys, and watch them live")
    trade = page.get_by_label("trade: order, end leases, bid, resell, top up, projects and SSH keys")
    provide = page.get_by_label("provide: register and manage nodes, GPUs and slices, payouts")
    assert read.is_checked() and trade.is_checked() and not provide.is_checked()  # a buyer's defaults
    keys = page.locator("#api-keys")
    keys.get_by_label("Key name").fill("dashboard")
    trade.uncheck()
    page.get_by_role("button", name="Create key").click()
    notice = page.locator(".card.notice")
    assert "It may: read." in notice.inner_text()
    secret = page.locator("#new-api-key").inner_text().strip()
    row = page.locator("#key-list tr", has_text="dashboard")
    assert row.locator(".pill", has_text="read").count() == 1 and row.locator(".pill", has_text="trade").count() == 0
    screenshot(page, request)

    status, body = call_api(stack.url, "GET", "/api/v1/orders/", key=secret)
    assert status == 200 and len(body["results"]) == min(body["count"], 50)  # (other tests order as this buyer)
    status, body = call_api(stack.url, "POST", "/api/v1/orders/", {"mode": "on_demand"}, key=secret)
    assert status == 403 and body["error"]["code"] == "missing_scope" and body["error"]["details"] == {"scope": "trade"}

    # No scope at all is refused beside the boxes, and the name is kept.
    keys.get_by_label("Key name").fill("nothing")
    for box in (read, trade):
        box.uncheck()
    page.get_by_role("button", name="Create key").click()
    assert page.locator("#id_scopes_error").inner_text() == "Choose at least one scope."
    assert page.locator("#api-keys").get_by_label("Key name").input_value() == "nothing"


def test_a_provider_renames_a_node_then_deletes_it_after_confirming_and_its_agent_stops(stack, new_page, request):
    page = new_page()
    login(page, "prov-eve")
    page.get_by_role("link", name="Register a node").first.click()
    page.get_by_label("Name").fill("eve-old-box")
    page.get_by_role("button", name="Register").click()
    command = page.locator("#agent-command").inner_text().strip()
    assignment, *argv = shlex.split(command)
    name, _, value = assignment.partition("=")
    agent = stack._spawn("agent-eve-old-box", argv[1:] + ["--simulate", "l4:1", "--hostname", "old-box.e2e",
                                                         "--interval", "0.5"], {name: value})
    page.get_by_role("link", name="Watch it come online").click()
    page.locator("#node-status", has_text="Online").wait_for()

    page.locator("#node-rename summary").click()
    page.locator("#node-rename").get_by_label("Name").fill("eve-retired-box")
    page.locator("#node-rename").get_by_role("button", name="Rename").click()
    page.get_by_role("heading", name="eve-retired-box").wait_for()
    assert "is now called eve-retired-box" in page.locator(".flash").inner_text()
    screenshot(page, request, "-renamed")

    page.locator("#node-delete").click()
    assert "token stops working" in page.locator(".card.confirm").inner_text()
    screenshot(page, request, "-confirm")
    assert agent.poll() is None  # asking deletes nothing
    page.get_by_role("button", name="Delete eve-retired-box").click()
    page.wait_for_url("**/nodes/")
    assert "eve-retired-box is deleted" in page.locator(".flash").inner_text()
    assert page.get_by_role("link", name="eve-retired-box").count() == 0
    # Its agent was told why and stopped: exit 3, the server refused its token.
    assert wait_until(lambda: agent.poll() is not None, timeout=30, what="the agent to stop") and agent.returncode == 3
    assert "deleted by its provider" in (stack.tmp / "agent-eve-old-box.log").read_text()
