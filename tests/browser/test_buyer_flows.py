"""A buyer's day in the browser: top up with Stripe.js (the local fake Stripe and its fake Stripe.js), order
a MIG slice on demand, watch it run with a chart that moves, end it and see the charge; book a reservation
on the calendar, list part of it for resale, and buy that part as a second user."""
from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest

from tests.browser.conftest import login, screenshot

pytestmark = pytest.mark.browser
GOOD_CARD = "4242424242424242"


def top_up(page, amount: str) -> None:
    page.goto("/billing/")
    before = page.locator("#balance").get_attribute("data-amount")
    page.get_by_label("Amount (USD)").fill(amount)
    card = page.locator("#card-element")
    card.locator('input[placeholder="number"]').fill(GOOD_CARD)
    card.locator('input[placeholder="exp_month"]').fill("12")
    card.locator('input[placeholder="exp_year"]').fill("34")
    card.locator('input[placeholder="cvc"]').fill("123")
    card.locator('input[placeholder="postal_code"]').fill("75001")
    page.get_by_role("button", name="Pay").click()
    page.locator("#topup-status", has_text="the wallet is credited").wait_for()
    assert page.locator("#balance").get_attribute("data-amount") != before


def samples(page) -> int:
    return int(page.locator("#charts").get_attribute("data-samples") or 0)


def test_a_buyer_tops_up_orders_a_mig_slice_on_demand_watches_it_run_ends_it_and_sees_the_charge(
        stack, new_page, request):
    page = new_page()
    login(page, "buyer-ann")

    # A bad amount is refused beside the field, and what was typed stays.
    page.goto("/billing/")
    page.get_by_label("Amount (USD)").fill("0.5")
    page.get_by_role("button", name="Pay").click()
    page.locator("#id_amount_error").wait_for()
    assert page.get_by_label("Amount (USD)").input_value() == "0.5"
    top_up(page, "25.00")
    assert page.locator("#balance").inner_text() == "$25.00"
    page.reload()
    assert page.locator("#ledger .pill", has_text="top-ups").count() == 1

    # The catalog lists the H100's slices; order the smallest one on demand.
    page.get_by_role("link", name="Catalog").click()
    row = page.locator('tr[data-unit="h100-80gb:1g.10gb:eu-west"]')
    assert row.locator("td.free").inner_text().strip().startswith(("14", "13", "12"))  # free 1g slices
    row.get_by_role("link", name="Order").click()
    page.wait_for_url(re.compile(r"/order/\?"))
    page.wait_for_load_state()  # htmx listens once the page has loaded
    page.get_by_label("Duration (hours)").fill("2")
    # The preview follows the form: 1.8 x 2.00/h x 1/7 = 0.5143/h, two hours = 1.03.
    page.wait_for_function("() => (document.getElementById('quote-total') || {}).textContent === '$1.03'")
    assert page.locator("#quote-per-hour").inner_text() == "$0.5143"
    screenshot(page, request, "-order")
    page.get_by_role("button", name="Place order").click()

    # The lease page: running with its MIG device once the agent carved it, a chart that moves, cost ticking.
    page.wait_for_url(re.compile(r"/leases/[0-9a-f-]+/$"))
    page.locator("#lease-state", has_text="running").wait_for()
    assert page.locator("#cuda-env").inner_text().startswith("CUDA_VISIBLE_DEVICES=MIG-")
    page.wait_for_function("() => Number(document.getElementById('charts').dataset.samples || 0) >= 3")
    n = samples(page)
    page.wait_for_function(f"() => Number(document.getElementById('charts').dataset.samples || 0) > {n}")
    page.wait_for_function("() => Number(document.getElementById('charts').dataset.samples || 0) >= 8")
    first_cost = page.locator("#lease-cost").inner_text()
    page.wait_for_function(f"() => document.getElementById('lease-cost').textContent !== {first_cost!r}")
    screenshot(page, request)

    page.get_by_role("link", name="End lease").click()
    page.get_by_role("button", name="End lease").click()  # the confirmation page's
    page.wait_for_url(re.compile(r"/leases/[0-9a-f-]+/$"))
    page.locator("#lease-state", has_text=re.compile("ending|ended")).wait_for()
    page.locator("#lease-state", has_text="ended").wait_for()
    charged = page.locator("#lease-charged").inner_text()
    assert charged.startswith("$") and float(charged[1:]) > 0

    # The charge is on the ledger and the wallet went down by it.
    page.get_by_role("link", name="Billing").click()
    assert page.locator("#ledger").get_by_text("usage").count() >= 1
    assert float(page.locator("#balance").get_attribute("data-amount")) < 25
    assert page.locator("#spend-by-model").get_by_text("h100-80gb").count() == 1
    screenshot(page, request, "-billing")


def test_a_buyer_books_a_window_lists_part_of_it_and_a_second_user_buys_it(stack, new_page, request):
    seller = new_page()
    login(seller, "buyer-bob")
    top_up(seller, "40.00")

    # Book a window on the calendar: the first free hour three or more hours ahead.
    seller.goto("/order/?mode=reserved&gpu_model=h100-80gb&memory_gb=20&compute_slices=2")
    seller.locator("#calendar").wait_for()
    seller.wait_for_load_state()
    now = datetime.utcnow()
    free = seller.locator(".calendar .slot.free")
    starts = [free.nth(i).get_attribute("data-start") for i in range(min(free.count(), 12))]
    start = next(s for s in starts if datetime.fromisoformat(s) >= now + timedelta(hours=3))
    first = seller.locator(f'.calendar .slot.free[data-start="{start}"]')
    first.click()
    assert seller.get_by_label("Window start (UTC)").input_value() == start
    end_hour = (datetime.fromisoformat(start) + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M")
    seller.locator(f'.calendar .slot.free[data-start="{end_hour}"]').click()
    assert seller.get_by_label("Window end (UTC)").input_value() == (
        datetime.fromisoformat(start) + timedelta(hours=2)).strftime("%Y-%m-%d %H:%M")
    seller.wait_for_function("() => (document.getElementById('quote-total') || {}).textContent === '$0.97'")  # 0.85 x 2.00 x 2/7 = 0.4857/h, 2 h
    # The preview has been drawn again from the server: the window is still shown as chosen, both of its hours.
    chosen = seller.locator(".calendar .slot.chosen")
    assert [chosen.nth(i).get_attribute("data-start") for i in range(chosen.count())] == [start, end_hour]
    assert seller.locator("#chosen-window").inner_text().endswith("UTC")
    screenshot(seller, request, "-calendar")
    seller.get_by_role("button", name="Place order").click()
    seller.wait_for_url(re.compile(r"/reservations/$"))
    card = seller.locator("article[data-reservation]").first
    assert "paid $0.97" in card.inner_text()

    # List its first half hour for resale: the cap is shown; an ask above it is refused beside the field.
    card.get_by_text("List part of it for resale").click()
    cap = float(card.locator(".resale-cap").inner_text().lstrip("$"))
    card.get_by_label("From (UTC)").fill(start)
    card.get_by_label("Until (UTC)").fill((datetime.fromisoformat(start) + timedelta(minutes=30)).strftime("%Y-%m-%d %H:%M"))
    card.get_by_label("Ask per hour (USD)").fill(f"{cap + 1:.4f}")
    card.get_by_role("button", name="List for resale").click()
    card = seller.locator("article[data-reservation]").first
    card.locator("p.error", has_text="at most").wait_for()
    assert card.get_by_label("Until (UTC)").input_value().endswith(":30")
    card.get_by_label("Ask per hour (USD)").fill("0.2")
    card.get_by_role("button", name="List for resale").click()
    seller.locator(".flash", has_text="Listed").wait_for()

    # A second user buys it in one step on the public resale market.
    buyer = new_page()
    login(buyer, "buyer-cat")
    top_up(buyer, "5.00")
    buyer.get_by_role("link", name="Resale").click()
    listing = buyer.locator("tr[data-listing]").filter(has_text="h100-80gb")
    assert listing.count() == 1 and "$0.10" in listing.inner_text()  # 0.2/h x 30 min
    listing.get_by_role("link", name=re.compile("^Buy")).click()
    buyer.get_by_role("button", name="Buy for $0.10").click()  # the confirmation page's
    buyer.locator(".flash", has_text="Bought").wait_for()
    assert buyer.locator("article[data-reservation]").count() == 1
    assert float(buyer.locator(".head strong").first.inner_text().lstrip("$")) == pytest.approx(4.90)
    screenshot(buyer, request, "-bought")

    # The seller's listing shows sold; the resale market no longer offers it.
    seller.reload()
    assert seller.locator("#my-listings .pill.sold").count() == 1
    seller.get_by_role("link", name="Resale").click()
    assert seller.locator("tr[data-listing]").count() == 0

    # On a phone, without JavaScript, the public pages still render and filter (server-side).
    phone = new_page(viewport=(390, 844), javascript=False)
    phone.goto("/catalog/?gpu_model=h100-80gb")
    assert phone.locator('tr[data-unit^="h100-80gb:"]').count() >= 5
    phone.get_by_label("Min memory (GB)").fill("40")
    phone.get_by_role("button", name="Apply").click()
    assert phone.locator('tr[data-unit="h100-80gb:1g.10gb:eu-west"]').count() == 0
    assert phone.locator('tr[data-unit="h100-80gb:3g.40gb:eu-west"]').count() == 1
    screenshot(phone, request, "-phone")
