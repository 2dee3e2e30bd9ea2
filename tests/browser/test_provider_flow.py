"""An account becomes a provider in the browser (the provider terms, a display name, the payout country), registers
a node, starts the agent with the command the page shows, and watches the node come online with its GPUs and live
charts that move."""
from __future__ import annotations

import shlex
import sys

import pytest

from tests.browser.conftest import login, screenshot

pytestmark = pytest.mark.browser


def samples(page) -> int:
    return int(page.locator("#charts").get_attribute("data-samples") or 0)


def test_a_provider_registers_a_node_starts_the_agent_and_sees_it_online_with_moving_charts(stack, new_page, request):
    page = new_page()
    login(page, "prov-dan")
    # Not a provider yet: registering a node starts with the provider step, then comes back.
    page.get_by_role("link", name="Register a node").first.click()
    page.wait_for_url("**/provider/?next=/nodes/register/")
    assert page.locator("#terms-version").inner_text().startswith("version ")
    page.get_by_label("Display name").fill("Dan's GPU rack")
    page.get_by_label("Payout country").select_option("SE")
    page.get_by_role("button", name="Become a provider").click()
    page.locator("#id_terms_accepted_error").wait_for()  # the terms were not accepted: said beside the box
    page.get_by_label("I have read and accept the provider terms").check()
    screenshot(page, request, "-provider-step")
    page.get_by_role("button", name="Become a provider").click()
    page.wait_for_url("**/nodes/register/")
    assert "You are a provider now" in page.locator(".flash").inner_text()
    page.get_by_label("Name").fill("dan-rack-1")
    page.get_by_label("Region").fill("eu-north")
    page.get_by_role("button", name="Register").click()

    token = page.locator("#node-token").inner_text().strip()
    command = page.locator("#agent-command").inner_text().strip()
    assert token.startswith("gpm_node_")
    assert command == f"NODEAGENT_TOKEN={token} python -m nodeagent --server ws://127.0.0.1:{stack.port}/ws/agent/"
    screenshot(page, request, "-token")

    # Start the agent exactly as the page says (a simulated GPU server: no GPU here).
    assignment, *argv = shlex.split(command)
    name, _, value = assignment.partition("=")
    assert argv[:3] == ["python", "-m", "nodeagent"] and name == "NODEAGENT_TOKEN"
    stack._spawn("agent-dan-rack-1", argv[1:] + ["--simulate", "a100-80gb:2", "--hostname", "dan-rack-1.e2e",
                                                 "--interval", "0.5"], {name: value})
    page.get_by_role("link", name="Watch it come online").click()

    # The status pill turns online over the websocket; the GPU table fills in through htmx.
    page.locator("#node-status", has_text="Online").wait_for()
    page.locator("#gpus tr[data-gpu]").nth(1).wait_for()
    assert page.locator("#gpus tr[data-gpu]").count() == 2
    assert page.locator("#live-state").inner_text() == "live"
    # The charts move: the number of samples on screen grows as the agent reports.
    page.wait_for_function("() => Number(document.getElementById('charts').dataset.samples || 0) >= 3")
    before = samples(page)
    page.wait_for_function(f"() => Number(document.getElementById('charts').dataset.samples || 0) > {before}")
    assert page.locator("#charts .chart canvas").count() == 4

    # The provider's node list shows it, and another provider's node is not there.
    page.get_by_role("link", name="My nodes").click()
    assert page.get_by_role("link", name="dan-rack-1").is_visible()
    assert page.get_by_text("market-h100").count() == 0
    page.get_by_role("link", name="dan-rack-1").click()
    page.wait_for_function("() => Number(document.getElementById('charts').dataset.samples || 0) >= 2")
    screenshot(page, request)
    assert sys.executable  # the agent ran under this interpreter
