"""The console without rough edges (issue 11), in Chromium against the live stack, for a buyer and a provider with
seeded data (a running lease, an ended one, a reservation, a listing to buy, keys, a project, a node):

1. layout: at 1366×768 and 390×844 no console page scrolls sideways, and the catalog's Order action is in view;
2. no template syntax in any console page (every page reachable from the menu, crawled, confirmation pages and an
   ended lease included);
3. a chart with one point has a sane x axis: no span of years, its times within the data;
4. each destructive action asks first, and answering "keep" leaves everything as it was.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from urllib.parse import urljoin, urlparse

import pytest

from tests.browser.conftest import screenshot, wait_until
from tests.e2e.livestack import call_api

pytestmark = pytest.mark.browser

PASSWORD = "e2e-password"  # of the users the live stack seeds (tests/e2e/livestack.py)
SYNTAX = ("{#", "#}", "{{", "}}", "{%", "%}")
# Not console pages: leaving, other apps, files.
SKIP = re.compile(r"^/(logout|api|admin|static|stripe)/|\.csv$|/logs/$|^/favicon")
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvdWoRSPk6mTuqxAPGlS2CqT3IUKOIbe3iWDnKd0OZ3 eve@laptop"


@pytest.fixture(scope="module")
def seeded(stack):
    """A buyer (eve) with a running lease, an ended one, a booked window, an API key, an SSH key and a project; a
    second buyer's window listed for resale; the stack's provider with its node."""
    eve, fay = stack.add_buyers(["crawl-eve", "crawl-fay"], credit="100")
    base, key = stack.url, eve["api_key"]

    def api(method, path, body=None, who=key):
        status, out = call_api(base, method, path, body, key=who)
        assert status < 300, (path, status, out)
        return out

    def running_lease() -> str:
        order = api("POST", "/api/v1/orders/", {"mode": "on_demand", "gpu_models": ["h100-80gb"], "memory_gb": 10})
        lease_id = order["leases"][0]
        wait_until(lambda: api("GET", f"/api/v1/leases/{lease_id}/")["state"] == "running", timeout=60,
                   what="the lease to run")
        return lease_id

    ended = running_lease()
    api("POST", f"/api/v1/leases/{ended}/end/")
    wait_until(lambda: api("GET", f"/api/v1/leases/{ended}/")["state"] == "ended", timeout=60, what="its end")
    running = running_lease()
    at = (datetime.now(timezone.utc) + timedelta(hours=30)).replace(minute=0, second=0, microsecond=0)
    window = {"mode": "reserved", "gpu_models": ["h100-80gb"], "memory_gb": 10,
              "window_start": at.isoformat(), "window_end": (at + timedelta(hours=2)).isoformat()}
    reservation = api("POST", "/api/v1/orders/", window)["reservations"][0]
    theirs = api("POST", "/api/v1/orders/", window, who=fay["api_key"])["reservations"][0]
    listing = api("POST", f"/api/v1/reservations/{theirs}/list-for-resale/",
                  {"starts_at": at.isoformat(), "ends_at": (at + timedelta(hours=1)).isoformat(),
                   "ask_per_hour": "0.1"}, who=fay["api_key"])["id"]
    api("POST", "/api/v1/ssh-keys/", {"name": "laptop", "public_key": SSH_KEY})
    project = api("POST", "/api/v1/projects/", {"name": "vision"})["id"]
    yield {"buyer": eve["name"], "key": key, "running": running, "ended": ended, "reservation": reservation,
            "listing": listing, "project": project, "provider": "e2e-provider", "node": stack.seed["nodes"][0]["id"]}
    # Leave the stack as the other browser tests expect it: no lease, window or listing of these buyers left.
    call_api(base, "POST", f"/api/v1/leases/{running}/end/", key=key)
    call_api(base, "POST", f"/api/v1/resale-listings/{listing}/withdraw/", key=fay["api_key"])
    for who, r in ((key, reservation), (fay["api_key"], theirs)):
        call_api(base, "POST", f"/api/v1/reservations/{r}/cancel/", key=who)


def log_in(page, username: str) -> None:
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"^(?!.*/login/).*$"))


def crawl(page, seeds: list[str], *, limit: int = 60):
    """Every console page reachable from `seeds` through links (GET only: following a link never changes anything,
    destructive actions' links lead to their confirmation). Yields (path, response body) once per path and query
    shape; a path with a query is visited twice at most (the catalog's Order links differ only by their unit)."""
    seen, shapes, queue = set(), {}, list(seeds)
    origin = urlparse(page.url).netloc
    while queue and len(seen) < limit:
        url = queue.pop(0)
        parts = urlparse(url)
        key = parts.path + ("?" + parts.query if parts.query else "")
        if key in seen or SKIP.search(parts.path) or (parts.query and shapes.get(parts.path, 0) >= 2):
            continue
        seen.add(key)
        shapes[parts.path] = shapes.get(parts.path, 0) + (1 if parts.query else 0)
        response = page.goto(key)
        assert response is not None and response.status in (200, 409), (key, response and response.status)
        yield key, response.text()
        for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))"):
            target = urlparse(urljoin(page.url, href))
            if target.netloc == origin and not href.startswith("#"):
                queue.append(target.path + ("?" + target.query if target.query else ""))


def console_urls(seeded) -> dict[str, list[str]]:
    s = seeded
    return {
        s["buyer"]: ["/catalog/", "/catalog/h100-80gb:1g.10gb:eu-west/", "/order/", "/order/?mode=reserved",
                     f"/leases/{s['running']}/", f"/leases/{s['ended']}/", f"/leases/{s['running']}/end/",
                     f"/reservations/{s['reservation']}/cancel/", f"/resale/{s['listing']}/buy/", "/billing/",
                     "/account/", "/jobs/", "/reservations/", "/resale/"],
        s["provider"]: ["/nodes/", f"/nodes/{s['node']}/", f"/nodes/{s['node']}/drain/", "/nodes/register/",
                        "/account/", "/catalog/"],
    }


def test_no_console_page_shows_template_syntax_to_a_buyer_or_a_provider(new_page, seeded):
    for user, seeds in console_urls(seeded).items():
        page = new_page(viewport=(1366, 768))
        log_in(page, user)
        visited = []
        for path, body in crawl(page, seeds):
            visited.append(path)
            found = [token for token in SYNTAX if token in body]
            assert not found, f"{path} shows {found} to {user}"
        # The crawl reached the pages that matter, the ended lease's among them.
        assert set(seeds) - {p for p in seeds if SKIP.search(p)} <= set(visited), set(seeds) - set(visited)
        assert len(visited) >= len(seeds)


@pytest.mark.parametrize("viewport", [(1366, 768), (390, 844)], ids=["laptop", "phone"])
def test_no_console_page_scrolls_sideways_and_the_catalogs_order_action_is_in_view(new_page, seeded, viewport,
                                                                                  request):
    width = viewport[0]
    for user, seeds in console_urls(seeded).items():
        page = new_page(viewport=viewport)
        log_in(page, user)
        for path, _ in crawl(page, seeds, limit=30):
            page.wait_for_load_state()
            wide = page.evaluate("() => document.documentElement.scrollWidth")
            assert wide <= width, f"{path} is {wide} px wide at {width} px ({user})"
    page = new_page(viewport=viewport)
    log_in(page, seeded["buyer"])
    page.goto("/catalog/")
    order = page.locator('tr[data-unit] a:text-is("Order")').first
    box = order.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, box
    # in view without scrolling the table sideways either
    table_box = page.locator("#catalog-table").bounding_box()
    assert page.evaluate("() => { const t = document.getElementById('catalog-table'); "
                         "return t.scrollWidth <= t.clientWidth; }"), "the catalog table scrolls sideways"
    assert box["x"] + box["width"] <= table_box["x"] + table_box["width"]
    if width <= 640:  # the menu folds behind a button on a phone, and opens
        assert page.locator("#main-nav").is_hidden()
        page.get_by_role("button", name="Menu").click()
        assert page.get_by_role("link", name="Billing").is_visible()
    screenshot(page, request)


def test_a_chart_with_one_point_has_a_sane_x_axis(new_page, seeded, stack):
    page = new_page(viewport=(1366, 768))
    log_in(page, seeded["buyer"])
    # The console's chart helper, given one point: the axis spans minutes around it, never years.
    page.goto("/catalog/h100-80gb:1g.10gb:eu-west/")
    page.wait_for_function("() => window.consoleCharts && window.uPlot")
    t = 1_790_000_000  # 2026-09-21 14:13:20 UTC
    page.evaluate("""(t) => {
        const el = document.createElement('div'); el.id = 'one-point'; el.style.width = '600px';
        document.body.appendChild(el);
        consoleCharts.timeChart(el, {series: [{label: 'one'}]}, [[t], [42]]);
    }""", t)
    page.wait_for_function("() => document.getElementById('one-point').dataset.ticks")
    one = page.locator("#one-point")
    x_min, x_max = float(one.get_attribute("data-x-min")), float(one.get_attribute("data-x-max"))
    labels = one.get_attribute("data-ticks")
    assert x_min < t < x_max and x_max - x_min <= 3600, (x_min, x_max)
    assert labels and not re.search(r"\b(19|20)\d\d\b", labels), labels
    assert re.search(r"\b14:1\d\b", labels), labels  # 24-hour UTC times around the point

    # The spot chart draws what was recorded (the beat records a price every 30 s), with times, not years.
    def drawn():
        page.reload()
        page.wait_for_load_state()
        return page.locator("#spot-chart canvas").count() > 0
    wait_until(drawn, timeout=90, interval=3, what="a recorded spot price")
    chart = page.locator("#spot-chart")
    page.wait_for_function("() => document.getElementById('spot-chart').dataset.ticks")
    assert not re.search(r"\b(19|20)\d\d\b", chart.get_attribute("data-ticks"))
    assert float(chart.get_attribute("data-x-max")) - float(chart.get_attribute("data-x-min")) <= 2 * 86400

    # An ended lease that ran under a minute or two draws its minutes within its run.
    lease = call_api(stack.url, "GET", f"/api/v1/leases/{seeded['ended']}/", key=seeded["key"])[1]
    page.goto(f"/leases/{seeded['ended']}/")
    history = page.locator('#history .chart[data-keys="util"]')
    if history.count():  # the gateway wrote its minute(s) (rollups are flushed every half second here)
        page.wait_for_function("() => document.querySelector('#history .chart').dataset.xMax")
        started = datetime.fromisoformat(lease["started_at"].replace("Z", "+00:00")).timestamp()
        ended = datetime.fromisoformat(lease["ended_at"].replace("Z", "+00:00")).timestamp()
        x_min, x_max = float(history.get_attribute("data-x-min")), float(history.get_attribute("data-x-max"))
        assert started - 120 <= x_min and x_max <= ended + 120 and x_max - x_min <= 3600
        assert not re.search(r"\b(19|20)\d\d\b", history.get_attribute("data-ticks"))
    else:
        assert page.locator("#no-history").is_visible()
    assert page.locator("#live-state").count() == 0  # an ended lease is not watched live

    # A live chart right after its first sample: the last two minutes.
    page.goto(f"/leases/{seeded['running']}/")
    page.wait_for_function("() => Number(document.getElementById('charts').dataset.samples || 0) >= 1")
    util = page.locator('#charts .chart[data-metric="util"]')
    x_min, x_max = float(util.get_attribute("data-x-min")), float(util.get_attribute("data-x-max"))
    assert 110 <= x_max - x_min <= 130
    assert not re.search(r"\b(19|20)\d\d\b", util.get_attribute("data-ticks"))


def keep(page, link_name: str, *, back: str) -> None:
    """Follow a destructive action's link, read its question, answer "keep": back where we were."""
    page.get_by_role("link", name=link_name).first.click()
    page.locator("#confirm-yes").wait_for()
    assert page.locator("#confirm-points li").count() >= 1
    page.locator("#confirm-no").click()
    page.wait_for_url(re.compile(back))


def test_each_destructive_action_asks_first_and_keeping_changes_nothing(new_page, seeded, request):
    s = seeded
    page = new_page(viewport=(1366, 768))
    log_in(page, s["buyer"])

    page.goto(f"/leases/{s['running']}/")
    keep(page, "End lease", back=rf"/leases/{s['running']}/$")
    page.locator("#lease-state", has_text="running").wait_for()

    page.goto("/reservations/")
    card = f"#reservation-{s['reservation']}"
    keep(page, "Cancel reservation", back=r"/reservations/$")
    assert page.locator(card + " .pill").inner_text() == "booked"

    page.goto("/resale/")
    keep(page, "Buy", back=r"/resale/$")
    assert page.locator(f'tr[data-listing="{s["listing"]}"]').count() == 1

    page.goto("/account/")
    page.locator("#id_name").fill("to-keep")  # the API key's name (the SSH key's field is labelled alike)
    page.get_by_role("button", name="Create key").click()
    page.goto("/account/")
    keep(page, "Revoke key to-keep", back=r"/account/")
    assert page.locator("#key-list tr", has_text="to-keep").locator(".pill.online").inner_text() == "active"
    keep(page, "Remove SSH key laptop", back=r"/account/")
    assert page.locator("#ssh-key-list tr", has_text="laptop").count() == 1
    keep(page, "Delete project vision", back=r"/account/")
    assert page.locator("#project-list tr", has_text="vision").count() == 1

    # Answering yes does it: the window is cancelled and refunded, as the question said.
    page.goto(f"/reservations/{s['reservation']}/cancel/")
    said = page.locator("#confirm-points").inner_text()
    refund = re.search(r"You get (\$[0-9.,]+) back", said).group(1)
    page.locator("#confirm-yes").click()
    page.locator(".flash", has_text=f"{refund} is back in your wallet").wait_for()
    screenshot(page, request, "-buyer")

    provider = new_page(viewport=(1366, 768))
    log_in(provider, s["provider"])
    provider.goto(f"/nodes/{s['node']}/")
    keep(provider, "Drain: no new work", back=rf"/nodes/{s['node']}/$")
    assert provider.locator("#node-status").inner_text().lower() == "online"
    screenshot(provider, request)
