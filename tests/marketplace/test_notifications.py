"""Account-level notification settings: where a market event's webhook goes, which kinds are sent, and the
SSRF guard on webhook URLs (refused unless public http(s); loopback only when settings.WEBHOOKS_ALLOW_LOOPBACK allows it (the demo))."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from marketplace import events as notify, notifications
from marketplace.lifecycle import leases
from marketplace.models import Lease, NotificationSettings, Order
from marketplace.products import orders
from marketplace.products.orders import OrderSpec
from scheduler.errors import DomainError
from tests.factories import UserFactory
from tests.marketplace.marketsim import Fleet, top_up

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch):
    """The webhooks the notification service would POST after commit: (url, payload)."""
    out: list = []
    monkeypatch.setattr(notify, "webhook_later", lambda url, payload: out.append((url, payload)) if url else None)
    return out


@pytest.mark.parametrize("url, why", [
    ("ftp://example.org/x", "http"),
    ("http://127.0.0.1:8000/hook", "loopback"),
    ("http://localhost/hook", "localhost"),
    ("http://[::1]/hook", "loopback"),
    ("http://10.1.2.3/hook", "private"),
    ("http://192.168.0.7/hook", "private"),
    ("http://169.254.169.254/latest/meta-data", "link-local"),
    ("http://0.0.0.0/", "not public"),
])
def test_webhook_urls_that_are_not_public_http_are_refused(url, why, settings):
    settings.WEBHOOKS_ALLOW_LOOPBACK = False
    with pytest.raises(DomainError, match=why) as err:
        notifications.notification_settings_update(user=UserFactory(), webhook_url=url)
    assert err.value.field == "webhook_url" and not NotificationSettings.objects.exists()


def test_the_demo_allows_loopback_webhooks_but_never_private_or_link_local_ones(settings):
    settings.WEBHOOKS_ALLOW_LOOPBACK = True
    user = UserFactory()
    row = notifications.notification_settings_update(user=user, webhook_url="http://127.0.0.1:9/hook")
    assert row.webhook_url == "http://127.0.0.1:9/hook"
    for url in ("http://10.0.0.1/hook", "http://169.254.169.254/"):
        with pytest.raises(DomainError):
            notifications.notification_settings_update(user=user, webhook_url=url)


def test_an_order_webhook_to_a_private_address_is_refused_and_nothing_is_written(settings):
    settings.WEBHOOKS_ALLOW_LOOPBACK = False
    Fleet().node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "10")
    with pytest.raises(DomainError) as err:
        orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", webhook_url="http://10.0.0.5/hook"))
    assert err.value.field == "webhook_url" and not Order.objects.exists()


def test_a_webhook_whose_name_resolves_to_a_private_address_is_not_posted_to(settings, monkeypatch):
    settings.WEBHOOKS_ALLOW_LOOPBACK = False
    monkeypatch.setattr(notifications.socket, "getaddrinfo",
                        lambda *a, **k: [(2, 1, 6, "", ("10.0.0.9", 80))])
    assert notify.webhook_post(url="http://hooks.example.org/x", payload={"a": 1}) is False


def test_market_events_go_to_the_accounts_webhook_unless_the_order_has_its_own_and_only_kinds_switched_on(sent):
    fleet = Fleet()
    fleet.node("l4:2", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "10")
    notifications.notification_settings_update(user=buyer, webhook_url="https://hooks.example.org/account",
                                               interruption=True, lease_ended=True, lease_failed=True,
                                               balance_low=False)
    plain = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True))
    own = orders.order_place(buyer=buyer, spec=OrderSpec(mode="spot", whole_gpu=True, max_price_per_hour=Decimal("1.8"),
                                                         webhook_url="https://hooks.example.org/order"))
    fleet.play()
    leases.lease_interrupt(lease_id=Lease.objects.get(order=own).pk, kind="preempted")
    leases.lease_end(lease_id=Lease.objects.get(order=plain).pk, buyer=buyer)
    fleet.play()
    kinds = [(url.rsplit("/", 1)[1], p["type"]) for url, p in sent]
    assert ("order", "interruption") in kinds  # the order's own URL wins
    assert ("account", "lease_ended") in kinds and ("account", "interruption") not in kinds
    sent.clear()
    NotificationSettings.objects.filter(user=buyer).update(lease_ended=False)
    leases.lease_end(lease_id=Lease.objects.get(order=own).pk, buyer=buyer)
    fleet.play()
    assert [p["type"] for _, p in sent] == []


def test_a_lease_that_fails_to_start_is_announced_to_the_accounts_webhook(sent):
    fleet = Fleet()
    fleet.node("a100-80gb:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "10")
    notifications.notification_settings_update(user=buyer, webhook_url="https://hooks.example.org/account")
    orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", memory_gb=10))
    fleet.play(fail_creates=True)
    assert [(u, p["type"]) for u, p in sent] == [("https://hooks.example.org/account", "lease_failed")]


@pytest.mark.parametrize("switched_on", [True, False])
def test_a_low_balance_is_warned_once_on_the_socket_and_to_the_webhook_only_when_switched_on(sent, settings,
                                                                                           monkeypatch,
                                                                                           switched_on):
    told = []
    monkeypatch.setattr(notify, "tell_buyer", lambda user_id, event: told.append(event["type"]))
    settings.MARKET = {**settings.MARKET, "BALANCE_WARN_SECONDS": 10 * 3600}  # 10 USD at 1.80/h lasts 5.5 h
    fleet = Fleet()
    fleet.node("l4:1", price="1.00")
    buyer = UserFactory()
    top_up(buyer, "10")
    notifications.notification_settings_update(user=buyer, webhook_url="https://hooks.example.org/account",
                                               balance_low=switched_on)
    order = orders.order_place(buyer=buyer, spec=OrderSpec(mode="on_demand", whole_gpu=True))
    lease = Lease.objects.get(order=order)
    leases.meter_tick(now=lease.started_at + timedelta(seconds=5))
    leases.meter_tick(now=lease.started_at + timedelta(seconds=10))  # warned already: not again at once
    assert told.count("balance_low") == 1 and Lease.objects.get(pk=lease.pk).warned_at is not None
    assert [p["type"] for _, p in sent] == (["balance_low"] if switched_on else [])
