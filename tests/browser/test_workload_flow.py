"""A buyer's container in the browser, on a real engine: add an SSH key on the account page, order an operator's
template, watch the lease page reach running, copy the SSH command and log in with it, see the container's output
arrive live, end it. The stack's agent runs containers on Podman (tests/enginefix.py), its ports on loopback."""
from __future__ import annotations

import json
import re

import pytest

from tests.browser.conftest import BrowserStack, USERS, login, screenshot
from tests.engine.images import HOST_KEY
from tests.enginefix import free_port_block, ssh, ssh_keypair

pytestmark = pytest.mark.browser

# A template as an operator would make it, on the local test image: dropbear in the background (it daemonizes
# without -F) and a line of output every second.
SEED = r"""
import json
from decimal import Decimal
from django.contrib.auth import get_user_model
from marketplace.models import Template
from marketplace.money import movements
from scheduler.models import Node
spec = json.loads(%r)
Node.objects.update(public_address="127.0.0.1", port_range_start=spec["ports"][0], port_range_end=spec["ports"][1])
Template.objects.update(enabled=False)  # their images are on registries these machines cannot reach
Template.objects.create(key="e2e-sshd", name="Test box with SSH", image="localhost/gpm-sshd:test",
                        command=["sh", "-c"], args=[spec["boot"]], ports=[{"port": 22, "kind": "ssh"}], disk_gb=1)
movements.credit(user=get_user_model().objects.get(username=spec["user"]), amount=Decimal("20"),
                 idempotency_key="browser-workload-credit", memo="browser test credit")
print("OK")
"""
BOOT = (f"/usr/sbin/dropbear -E -s -r {HOST_KEY} -p 22; i=0; "
        "while true; do i=$((i+1)); echo step $i: loss 0.$((1000 - i)); sleep 1; done")


@pytest.fixture(scope="module")
def engine_stack(tmp_path_factory, engine_url, sshd_image):
    tmp = tmp_path_factory.mktemp("browser-workloads")
    s = BrowserStack(tmp, nodes=[("wl-a100", "a100-80gb:1")], agent_interval=0.5,
                     env={"FLEET_OFFLINE_CHECK": "2", "MARKET_METER_SECONDS": "1", "MARKET_LEASE_TICK_SECONDS": "1",
                          "MARKET_WORKLOAD_STOP_GRACE_SECONDS": "2"},
                     agent_args=("--runtime", "docker", "--engine-url", engine_url, "--gpu-devices", "none",
                                 "--bind-address", "127.0.0.1"))
    with s.running():
        s.shell(SEED % json.dumps({"ports": free_port_block(20), "boot": BOOT, "user": USERS[2]}))
        yield s


@pytest.fixture
def page(browser, engine_stack, request):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=engine_stack.url)
    ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=engine_stack.url)
    ctx.set_default_timeout(60_000)
    pg = ctx.new_page()
    yield pg
    if not getattr(request.node, "_screenshot_taken", False):
        screenshot(pg, request)
    ctx.close()


def test_a_buyer_orders_a_template_sees_it_run_copies_the_ssh_command_logs_in_and_watches_its_output(
        engine_stack, page, request, tmp_path):
    key_path, public_key = ssh_keypair(tmp_path, "browser")
    login(page, USERS[2])

    page.goto("/account/")
    page.get_by_label("Key name").last.fill("laptop")
    page.get_by_label("Public key").fill(public_key)
    page.get_by_role("button", name="Add SSH key").click()
    page.locator("#ssh-key-list", has_text="laptop").wait_for()

    page.goto("/order/")
    page.wait_for_load_state()
    page.get_by_label("Run", exact=True).select_option("e2e-sshd")
    page.get_by_label("Duration (hours)").fill("1")
    page.get_by_role("button", name="Place order").click()

    page.wait_for_url(re.compile(r"/leases/[0-9a-f-]+/$"))
    page.locator("#lease-state", has_text="running").wait_for()
    page.locator("#workload-state", has_text="running").wait_for()
    page.get_by_role("button", name="Copy the SSH command").click()
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert copied == page.locator("#ssh-command").inner_text()
    assert re.fullmatch(r"ssh -p \d+ root@127\.0\.0\.1", copied)
    login_ok = None
    for _ in range(20):  # dropbear may take a moment to listen after the container starts
        login_ok = ssh(key_path, "echo logged-in-as-$(id -u)", copied)
        if login_ok.returncode == 0:
            break
        page.wait_for_timeout(500)
    assert login_ok.stdout.strip() == "logged-in-as-0", login_ok.stderr

    # Output arrives over the socket while the page is open (no reload).
    page.wait_for_function("() => /step \\d+: loss/.test(document.getElementById('log-tail').textContent)")
    seen = page.locator("#log-tail").inner_text().count("step ")
    page.wait_for_function(f"() => document.getElementById('log-tail').textContent.split('step ').length - 1 > {seen}")
    screenshot(page, request)

    page.get_by_role("link", name="End lease").click()
    page.get_by_role("button", name="End lease").click()  # the confirmation page's
    page.locator("#lease-state", has_text="ended").wait_for()
    page.locator("#workload-state", has_text="removed").wait_for()
