"""Browser tests: Playwright driving Debian's Chromium (never a downloaded browser) against a live stack —
uvicorn, Celery worker and beat, real simulated agent processes, a local fake Stripe (localstripe) and a local SMTP
server the stack sends its e-mails to (`stack.mailbox`) — on loopback with its own SQLite database. One stack per
session; each test logs in its own users.

Each test leaves a screenshot in var/screenshots/<test name>.png (the README shows copies of two of them,
kept in docs/screenshots/).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.e2e.livestack import LiveStack, ROOT, wait_until
from tests.mailserver import smtp_server

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SHOTS = ROOT / "var" / "screenshots"  # not tracked; README images are copies in docs/screenshots
PASSWORD = "browser-pass-1"
USERS = ["buyer-ann", "buyer-bob", "buyer-cat", "buyer-dee", "prov-dan", "prov-eve"]
# prov-dan takes the provider step in its own test (test_provider_flow.py); prov-eve has taken it.
PROVIDERS = ["prov-eve"]

SEED_USERS = r"""
import json
from django.contrib.auth import get_user_model
from marketplace.products.accounts.providers import PROVIDER_TERMS_VERSION, provider_onboard
for name in json.loads(%r):
    get_user_model().objects.create_user(name, password=%r)
for name in json.loads(%r):
    provider_onboard(user=get_user_model().objects.get(username=name), display_name=name, payout_country="DE",
                     terms_accepted=True, terms_version=PROVIDER_TERMS_VERSION)
print("OK")
"""

pytestmark = pytest.mark.browser


def pytest_collection_modifyitems(config, items):
    if os.path.exists(CHROMIUM):
        return
    skip = pytest.mark.skip(reason=f"Debian's Chromium is not installed at {CHROMIUM} (apt-get install chromium); "
                                   "browser tests never download a browser")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


class BrowserStack(LiveStack):
    """The e2e live stack with its local fake Stripe, an SMTP server and a few users with passwords."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, stripe=True, **kwargs)

    def start(self) -> "BrowserStack":
        self._smtp = smtp_server()
        self.mailbox, smtp_port = self._smtp.__enter__()
        self.env.update({"EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(smtp_port)})
        super().start()
        self._run("manage.py", "shell", "-c", SEED_USERS % (json.dumps(USERS), PASSWORD, json.dumps(PROVIDERS)))
        return self

    def stop(self) -> None:
        super().stop()
        if getattr(self, "_smtp", None) is not None:
            self._smtp.__exit__(None, None, None)
            self._smtp = None


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    s = BrowserStack(tmp_path_factory.mktemp("browser-stack"),
                     nodes=[("market-h100", "h100-80gb:2")],
                     env={"FLEET_METRICS_FLUSH": "0.5", "FLEET_OFFLINE_CHECK": "2", "MARKET_METER_SECONDS": "1",
                          "MARKET_QUEUE_SECONDS": "1", "MARKET_LEASE_TICK_SECONDS": "1",
                          "MARKET_RESERVED_AHEAD_SECONDS": "3600", "MARKET_ALERTS_SECONDS": "2"},
                     agent_interval=0.5)
    with s.running():
        yield s


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def _shot_name(nodeid_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", nodeid_name).strip("-")


@pytest.fixture
def new_page(browser, stack, request):
    """Open a fresh browser context (its own cookies) at a laptop viewport; pages are screenshotted at the end."""
    contexts = []

    def make(*, viewport=(1280, 860), javascript=True):
        ctx = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]},
                                  java_script_enabled=javascript, base_url=stack.url)
        # Deadlines, not sleeps: a passing run never waits them out, and on a loaded 2-core machine the
        # agent, worker and server share the cores with the browser, so allow them time.
        ctx.set_default_timeout(45_000)
        contexts.append(ctx)
        page = ctx.new_page()
        page.on("dialog", lambda d: d.accept())
        return page

    yield make
    # The test's own picture: the last page of its first context, unless the test took one itself.
    if getattr(request.node, "_browser_failed", False):
        # Evidence for the failure report, kept out of docs/: the page as the browser had it.
        for i, ctx in enumerate(contexts):
            for j, pg in enumerate(ctx.pages):
                out = stack.tmp / f"failed-{_shot_name(request.node.name)}-{i}-{j}"
                pg.screenshot(path=f"{out}.png", full_page=True)
                Path(f"{out}.html").write_text(pg.content())
                print(f"page {pg.url} saved at {out}.png/.html")
    elif contexts and contexts[0].pages and not getattr(request.node, "_screenshot_taken", False):
        screenshot(contexts[0].pages[-1], request)
    for ctx in contexts:
        ctx.close()


def screenshot(page, request, suffix: str = "") -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{_shot_name(request.node.name)}{suffix}.png"
    page.screenshot(path=str(path), full_page=True)
    request.node._screenshot_taken = True
    return path


def login(page, username: str, password: str = PASSWORD) -> None:
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"^(?!.*/login/).*$"))


__all__ = ["login", "screenshot", "wait_until"]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.when == "call" and rep.failed:
        item._browser_failed = True
    return rep
