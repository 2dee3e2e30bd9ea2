"""The console's rough edges of issue 11, with the Django test client (no JavaScript): the billing numbers (a credit is
not spending; the statement and the ledger show the same usage the same way; GPU time reads right for a short lease;
usage is one ledger line per lease), refusals and money in the buyer's words in the console, the API and the preview,
destructive actions that ask first and change nothing until confirmed, in-page actions that say so in the page, the
icon and the admin's names."""
from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib import admin
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.lifecycle import leases
from marketplace.models import ApiKey, Lease, LedgerTransaction, Project, ResaleListing, Reservation, SshKey
from marketplace.money import movements
from marketplace.products import apikeys, orders, resale
from marketplace.products.orders import OrderSpec
from scheduler.models import Node
from tests.factories import UserFactory
from tests.marketplace.marketsim import top_up, wallet

pytestmark = pytest.mark.django_db

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvdWoRSPk6mTuqxAPGlS2CqT3IUKOIbe3iWDnKd0OZ3 ann@laptop"


def ran(fleet, buyer, *, model: str, seconds: int) -> Lease:
    """An on-demand lease of a whole `model` that ran `seconds`, ending now (metered and settled at its end; whole
    seconds, as metering counts from billing_start)."""
    end = timezone.now().replace(microsecond=0)
    start = end - timedelta(seconds=seconds)
    order = orders.order_place(buyer=buyer, now=start, spec=OrderSpec(mode="on_demand", gpu_models=[model],
                                                                      whole_gpu=True))
    fleet.play()
    lease = order.leases.get()
    Lease.objects.filter(pk=lease.pk).update(started_at=start, accrued_until=start, billed_until=start)
    leases.lease_end(lease_id=lease.pk, at=end)
    fleet.play()
    return Lease.objects.get(pk=lease.pk)


def text(html: str, element_id: str) -> str:
    return re.sub(r"<[^>]+>", "", re.search(rf'id="{element_id}"[^>]*>(.*?)</', html, re.S).group(1)).strip()


def cells(row_html: str) -> list[str]:
    return [re.sub(r"<[^>]+>|\s+", " ", c).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row_html, re.S)]


# --- billing numbers ---------------------------------------------------------------------------------------------

def test_a_welcome_credit_is_credit_received_not_spending(client, buyer):
    movements.credit(user=buyer, amount=Decimal("25"), idempotency_key="welcome", memo="demo welcome credit")
    html = client.get("/billing/").content.decode()
    assert text(html, "spent") == "$0.00" and text(html, "statement-total") == "$0.00"
    assert "$25.00" in text(html, "credits") and text(html, "statement-credits") == "$25.00"
    assert "−$25" not in html and "-$25" not in html
    ledger = html.split('id="ledger"')[1].split("</table>")[0]
    assert "demo welcome credit" in ledger and "$25.00" in ledger


def test_the_statement_and_the_ledger_show_a_short_leases_usage_alike_and_its_gpu_time_right(client, fleet, buyer):
    fleet.node("l4:1", price="1.00")  # 1.80/h: 0.0005 a second
    fleet.node("t4:1", price="1.00")
    top_up(buyer, "10")
    long = ran(fleet, buyer, model="l4", seconds=75)  # 0.0375: "$0.04"
    short = ran(fleet, buyer, model="t4", seconds=7)  # 0.0035: under half a cent, never "$0.00"
    assert (long.cost_charged, short.cost_charged) == (Decimal("0.037500"), Decimal("0.003500"))
    month = long.started_at.strftime("%Y-%m")
    html = client.get("/billing/", {"month": month}).content.decode()

    statement = html.split('id="statement"')[1].split("</table>")[0]
    rows = {c[2]: c for c in map(cells, re.findall(r"<tr>(.*?)</tr>", statement, re.S)) if len(c) == 6}
    assert rows["L4"][4:] == ["1 min 15 s", "$0.04"] and rows["T4"][4:] == ["7 s", "$0.0035"]
    ledger = html.split('id="ledger"')[1].split("</table>")[0]
    for lease, shown in ((long, "−$0.04"), (short, "−$0.0035")):
        row = re.search(rf'<tr data-kind="usage" data-lease="{lease.pk}">(.*?)</tr>', ledger, re.S).group(1)
        assert cells(row)[-1] == shown and "lease" in cells(row)[2]
    assert text(html, "gpu-time") == "1 min 22 s" and text(html, "spent") == "$0.04"  # 0.041 in all
    # The bars by model carry the same amounts: different lengths never read the same.
    bars = html.split('id="spend-by-model"')[1].split("</figure>")[0]
    assert re.findall(r'class="num">([^<]+)<', bars) == ["$0.04", "$0.0035"]
    assert "on_demand" not in html


def test_usage_reads_as_one_ledger_line_per_lease_with_its_minutes(client, fleet, buyer):
    fleet.node("l4:1", price="1.00")
    top_up(buyer, "10")
    lease = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", gpu_models=["l4"])).leases.get()
    fleet.play()
    lease.refresh_from_db()
    for minute in (1, 2, 3):
        leases.meter_tick(now=lease.started_at + timedelta(seconds=60 * minute + 1))
    html = client.get("/billing/").content.decode()
    ledger = html.split('id="ledger"')[1].split("</table>")[0]
    assert ledger.count('data-kind="usage"') == 1 and "charged in 3 minutes" in ledger
    memo = LedgerTransaction.objects.filter(kind="usage", lease_id=lease.pk).first().memo
    assert memo.startswith(f"On-demand lease {str(lease.pk)[:8]} (l4 whole GPU), ") and memo.endswith(" UTC")


# --- refusals and money in the buyer's words ------------------------------------------------------------------------

def test_a_refused_order_says_why_in_the_same_words_in_the_console_the_api_and_the_preview(client, fleet, buyer):
    fleet.node("l4:1", price="1.00", region="eu-west")
    top_up(buyer, "10")
    said = "No L4 slice with 10 GB in us-east is offered on the market."
    form = {"mode": "on_demand", "gpu_model": "l4", "memory_gb": "10", "compute_slices": "1", "region": "us-east",
            "duration_hours": "1", "if_unavailable": "fail", "workload": "none"}
    page = client.post("/order/", form).content.decode()
    assert said in page and "GPUs:" not in page and "not allowed" not in page
    api = APIClient()
    api.force_authenticate(buyer)
    r = api.post("/api/v1/orders/", {"mode": "on_demand", "gpu_models": ["l4"], "memory_gb": 10,
                                     "regions": ["us-east"]}, format="json")
    assert r.status_code == 409 and r.json()["error"]["message"] == said
    assert r.json()["error"]["details"]["reasons"] == {"region not allowed": 1}  # scripts keep the counts
    preview = client.get("/order/preview/", form).content.decode()
    assert said in preview

    # A spot bid under the price: the bid in the console's money, no engine words.
    form.update(mode="spot", region="", max_price_per_hour="0.2")
    page = client.post("/order/", form).content.decode()
    assert "No L4 slice with 10 GB is free under your bid of $0.2000/h" in page and "0.2/h" not in page


def test_a_resale_ask_above_the_cap_is_refused_with_the_cap_as_the_console_writes_it(client, fleet, buyer):
    fleet.node("l4:1", price="1.00")
    top_up(buyer, "10")
    start = (timezone.now() + timedelta(hours=30)).replace(second=0, microsecond=0)
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="reserved", gpu_models=["l4"], whole_gpu=True,
                                                           window_start=start, window_end=start + timedelta(hours=2)))
    r = Reservation.objects.get(order=order)
    page = client.post(f"/reservations/{r.pk}/list/", {
        f"{r.pk}-starts_at": start.strftime("%Y-%m-%d %H:%M"), f"{r.pk}-ends_at": r.ends_at.strftime("%Y-%m-%d %H:%M"),
        f"{r.pk}-ask_per_hour": "5"}).content.decode()
    assert "at most $0.9000/h" in page and "0.900000" not in page


# --- destructive actions ask first ----------------------------------------------------------------------------------

def confirm(client, url: str) -> str:
    """The confirmation page of a destructive action: asked for, answered with nothing changed yet."""
    r = client.get(url)
    html = r.content.decode()
    assert r.status_code == 200 and 'id="confirm-yes"' in html and 'id="confirm-no"' in html, html[:3000]
    assert re.search(rf'<form method="post" action="{re.escape(url)}"', html)
    return html


def test_every_destructive_action_asks_on_a_page_first_and_acts_only_when_confirmed(client, fleet, buyer):
    fleet.node("l4:2", price="1.00")
    top_up(buyer, "20")
    lease = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", gpu_models=["l4"])).leases.get()
    fleet.play()
    html = confirm(client, f"/leases/{lease.pk}/end/")
    assert "Billing stops now" in html and "Keep it running" in html
    assert Lease.objects.get(pk=lease.pk).state == "running"
    client.post(f"/leases/{lease.pk}/end/")
    assert Lease.objects.get(pk=lease.pk).state in ("ending", "ended")
    assert 'id="confirm-refused"' in client.get(f"/leases/{lease.pk}/end/").content.decode()

    start = (timezone.now() + timedelta(hours=30)).replace(second=0, microsecond=0)
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="reserved", gpu_models=["l4"], whole_gpu=True,
                                                           window_start=start, window_end=start + timedelta(hours=2)))
    r = Reservation.objects.get(order=order)
    html = confirm(client, f"/reservations/{r.pk}/cancel/")
    assert "You get $1.70 back" in html and Reservation.objects.get(pk=r.pk).state == "booked"
    before = wallet(buyer)
    client.post(f"/reservations/{r.pk}/cancel/")
    assert Reservation.objects.get(pk=r.pk).state == "cancelled" and wallet(buyer) == before + Decimal("1.70")

    seller = UserFactory()
    top_up(seller, "20")
    theirs = Reservation.objects.get(order=orders.order_place(buyer=seller, spec=OrderSpec(
        mode="reserved", gpu_models=["l4"], whole_gpu=True, window_start=start, window_end=start + timedelta(hours=2))))
    listing = resale.listing_create(seller=seller, reservation_id=theirs.pk, starts_at=start,
                                    ends_at=start + timedelta(hours=1), ask_per_hour=Decimal("0.5"))
    html = confirm(client, f"/resale/{listing.pk}/buy/")
    assert "Buy for $0.50" in html and "A purchase is final" in html
    assert ResaleListing.objects.get(pk=listing.pk).state == "open"
    client.post(f"/resale/{listing.pk}/buy/")
    assert ResaleListing.objects.get(pk=listing.pk).state == "sold"

    key, secret = apikeys.api_key_create(user=buyer, name="ci")
    confirm(client, f"/account/keys/{key.pk}/revoke/")
    assert apikeys.api_key_resolve(secret=secret) is not None
    client.post(f"/account/keys/{key.pk}/revoke/")
    assert apikeys.api_key_resolve(secret=secret) is None

    client.post("/account/ssh-keys/", {"ssh-name": "laptop", "ssh-public_key": SSH_KEY})
    ssh = SshKey.objects.get(user=buyer)
    confirm(client, f"/account/ssh-keys/{ssh.pk}/delete/")
    assert SshKey.objects.filter(pk=ssh.pk).exists()
    client.post(f"/account/ssh-keys/{ssh.pk}/delete/")
    assert not SshKey.objects.filter(pk=ssh.pk).exists()

    project = Project.objects.create(user=buyer, name="scratch")
    confirm(client, f"/account/projects/{project.pk}/delete/")
    assert Project.objects.filter(pk=project.pk).exists()
    client.post(f"/account/projects/{project.pk}/delete/")
    assert not Project.objects.filter(pk=project.pk).exists()

    # The pages link to the questions, not straight to the actions.
    key = ApiKey.objects.create(user=buyer, name="k2", prefix="gpm_key_x", key_hash="h")
    client.post("/account/ssh-keys/", {"ssh-name": "laptop", "ssh-public_key": SSH_KEY})
    project = Project.objects.create(user=buyer, name="scratch")
    account = client.get("/account/").content.decode()
    for action in (f"/account/keys/{key.pk}/revoke/", f"/account/ssh-keys/{SshKey.objects.get(user=buyer).pk}/delete/",
                   f"/account/projects/{project.pk}/delete/"):
        assert f'href="{action}"' in account and f'action="{action}"' not in account


def test_draining_asks_first_and_undraining_does_not(client, fleet):
    prov = UserFactory(username="pam")
    client.force_login(prov)
    node = fleet.node("l4:1", provider=prov)
    page = client.get(f"/nodes/{node.pk}/").content.decode()
    assert f'href="/nodes/{node.pk}/drain/"' in page
    html = confirm(client, f"/nodes/{node.pk}/drain/")
    assert 'name="action" value="drain"' in html and Node.objects.get(pk=node.pk).status == "online"
    client.post(f"/nodes/{node.pk}/drain/", {"action": "drain"})
    assert Node.objects.get(pk=node.pk).status == "draining"
    page = client.get(f"/nodes/{node.pk}/").content.decode()
    assert 'name="action" value="undrain"' in page  # taking work again is one click


# --- in-page actions say so in the page ------------------------------------------------------------------------------

def test_cordoning_in_the_page_says_so_there_and_not_later_on_another_page(client, fleet):
    prov = UserFactory(username="pam")
    client.force_login(prov)
    node = fleet.node("l4:1", provider=prov)
    gpu = node.gpus.get()
    r = client.post(f"/nodes/{node.pk}/gpus/{gpu.pk}/health/", {"action": "cordon"}, HTTP_HX_REQUEST="true")
    html = r.content.decode()
    assert 'id="gpu-notice" hx-swap-oob="true"' in html and "gpu0 is cordoned" in html
    later = client.get("/account/").content.decode()
    assert "cordoned" not in later and 'class="flash' not in later
    # Without JavaScript the form posts, the page is shown again, and the message comes with it.
    r = client.post(f"/nodes/{node.pk}/gpus/{gpu.pk}/health/", {"action": "uncordon"}, follow=True)
    assert "gpu0 is back in service" in r.content.decode()
    assert 'class="flash' not in client.get("/account/").content.decode()


# --- icon and admin --------------------------------------------------------------------------------------------------

def test_pages_have_an_icon_and_the_root_icon_address_finds_it(client):
    html = client.get("/catalog/").content.decode()
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in html
    r = client.get("/favicon.ico")
    assert r.status_code == 301 and r["Location"] == "/static/favicon.svg"
    assert client.get("/static/favicon.svg").status_code == 200


def test_the_admin_names_every_model_in_plain_english():
    names = {m._meta.verbose_name_plural for m in admin.site._registry}
    for wrong in [n for n in names if re.search(r"[^aeiou]ys$|ss$|\b(api|ssh|gpu|gpus|mig)\b", str(n))]:
        pytest.fail(f"the admin says {wrong!r}")
    assert {"ledger entries", "API keys", "SSH keys", "GPUs", "GPU models"} <= {str(n) for n in names}
