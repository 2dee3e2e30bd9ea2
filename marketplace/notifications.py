"""Account-level notification settings and where a market event's webhook goes: the order's own URL wins,
else the account's URL when that kind is on. Webhook URLs are http(s) to public addresses only (no SSRF into
the platform's network): loopback, private, link-local, reserved and multicast addresses are refused, at
save time for literal addresses and names like localhost, and again at delivery for the addresses a name
resolves to. settings.WEBHOOKS_ALLOW_LOOPBACK (the demo) allows loopback, never private ranges."""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction

from marketplace.models import NotificationSettings
from scheduler.errors import DomainError

LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def _address_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if getattr(ip, "ipv4_mapped", None):
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return None if settings.WEBHOOKS_ALLOW_LOOPBACK else "a loopback address"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return "an address that is not public"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "an address that is not public"
    return None


def webhook_url_check(url: str, *, field: str = "webhook_url", resolve: bool = False) -> str:
    """`url` if it is an http(s) URL to a public host; DomainError naming `field` otherwise. With `resolve`,
    every address the host name resolves to must be public too (delivery time)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        raise DomainError("not a URL", field=field) from None
    if parts.scheme not in ("http", "https"):
        raise DomainError("a webhook URL starts with http:// or https://", field=field)
    if not host:
        raise DomainError("a webhook URL names a host", field=field)
    if host.lower().rstrip(".") in LOCAL_NAMES or host.lower().endswith(".localhost"):
        if not settings.WEBHOOKS_ALLOW_LOOPBACK:
            raise DomainError("a webhook URL cannot point at this machine (localhost)", field=field)
        return url
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        addresses = []
        if resolve:
            try:
                infos = socket.getaddrinfo(host, parts.port or (443 if parts.scheme == "https" else 80),
                                           type=socket.SOCK_STREAM)
            except OSError:
                raise DomainError(f"the webhook host {host} does not resolve", field=field) from None
            addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    for ip in addresses:
        problem = _address_problem(ip)
        if problem:
            raise DomainError(f"a webhook URL cannot point at {problem} ({ip})", field=field)
    return url


def notification_settings_for(*, user) -> NotificationSettings:
    """The user's settings (unsaved defaults, every kind on and no URL, before the first save)."""
    found = NotificationSettings.objects.filter(user=user).first()
    return found if found is not None else NotificationSettings(user=user)


def notification_settings_update(*, user, webhook_url: str = "", **kinds: bool) -> NotificationSettings:
    """Save the user's webhook URL (checked) and which kinds of events are sent."""
    unknown = set(kinds) - set(NotificationSettings.KINDS)
    if unknown:
        raise DomainError(f"unknown notification kind {sorted(unknown)[0]!r}")
    if webhook_url:
        webhook_url_check(webhook_url)
    with transaction.atomic():
        row, _ = NotificationSettings.objects.select_for_update().get_or_create(user=user)
        row.webhook_url = webhook_url
        for kind, on in kinds.items():
            setattr(row, kind, bool(on))
        row.save()
    return row


def webhook_for(*, user_id, kind: str, order_webhook: str = "") -> str:
    """Where an event of `kind` for `user_id` is POSTed: the order's own URL wins; else the account's URL if
    that kind is on; "" for nowhere. A kind switched off on the account is sent nowhere."""
    row = NotificationSettings.objects.filter(user_id=user_id).first()
    if row is not None and not row.wants(kind):
        return ""
    if order_webhook:
        return order_webhook
    return row.webhook_url if row is not None else ""
