"""Log-in throttling and lock-out on the console, the admin and API keys: five wrong passwords lock an account for
15 minutes (its owner e-mailed once, the right password refused meanwhile), one address's failures and invalid API
keys are throttled (429 with Retry-After), counts are shared by web processes and the lock holds without Redis."""
from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth import authenticate
from django.test import RequestFactory
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.models import AccountSecurity
from marketplace.products.apikeys import api_key_create
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
RIGHT = "the-right-password"


@pytest.fixture
def ann():
    return UserFactory(username="ann", email="ann@example.org", password=RIGHT)


def log_in(client, password, *, username="ann", path="/login/", **extra):
    return client.post(path, {"username": username, "password": password}, **extra)


def test_forty_wrong_passwords_lock_the_account_and_the_right_one_is_refused_after_them(
        client, ann, django_capture_on_commit_callbacks, mailoutbox):
    with django_capture_on_commit_callbacks(execute=True):
        answers = [log_in(client, f"guess-{n}") for n in range(40)]
    assert [r.status_code for r in answers[:4]] == [200] * 4
    assert all(b"Wrong username, e-mail or password." in r.content for r in answers[:4])
    # The fifth locks; every later try is refused before its password is looked at, with 429 and Retry-After.
    assert all(r.status_code == 429 for r in answers[4:])
    assert "This account is locked for 15 minutes after 5 failed log-ins" in answers[4].content.decode()
    assert 890 <= int(answers[-1]["Retry-After"]) <= 900
    r = log_in(client, RIGHT)
    assert r.status_code == 429 and b"locked" in r.content and "_auth_user_id" not in client.session
    # One e-mail to the owner, saying what happened and what to do.
    assert len(mailoutbox) == 1 and mailoutbox[0].to == ["ann@example.org"]
    assert "locked for 15 minutes" in mailoutbox[0].subject and "reset your password" in mailoutbox[0].body
    assert "127.0.0.1" in mailoutbox[0].body


def test_the_lock_ends_by_itself_and_a_log_in_then_forgets_the_failures(client, ann):
    for n in range(5):
        log_in(client, f"guess-{n}")
    row = AccountSecurity.objects.get(user=ann)
    assert row.locked_until > timezone.now()
    AccountSecurity.objects.filter(pk=row.pk).update(locked_until=timezone.now() - timedelta(seconds=1))
    assert log_in(client, RIGHT).status_code == 302
    row.refresh_from_db()
    assert row.failures == 0 and row.failures_since is None
    client.post("/logout/")
    for n in range(4):  # four new failures do not lock: the count started again
        log_in(client, f"again-{n}")
    assert log_in(client, RIGHT).status_code == 302


def test_a_password_reset_lifts_the_lock(client, ann, mailoutbox):
    for n in range(5):
        log_in(client, f"guess-{n}")
    client.post("/password/reset/", {"email": "ann@example.org"})
    link = next(line for line in mailoutbox[-1].body.splitlines() if "/password/reset/" in line).strip()
    r = client.get(link.replace("http://testserver", ""), follow=True)
    client.post(r.redirect_chain[-1][0], {"new_password1": "brand-new-pass-1", "new_password2": "brand-new-pass-1"})
    assert log_in(client, "brand-new-pass-1").status_code == 302


def test_the_admin_logs_in_through_the_same_lock_out_and_only_lets_operators_in(client):
    op = UserFactory(username="op", password=RIGHT, is_staff=True, is_superuser=True)
    UserFactory(username="buyer", password=RIGHT)
    r = client.get("/admin/")
    assert r.status_code == 302 and r["Location"].startswith("/admin/login/")
    r = log_in(client, RIGHT, username="buyer", path="/admin/login/")
    assert r.status_code == 200 and b"This log-in is for operators" in r.content
    for n in range(5):
        log_in(client, f"guess-{n}", username="op", path="/admin/login/")
    r = log_in(client, RIGHT, username="op", path="/admin/login/")
    assert r.status_code == 429 and b"This account is locked" in r.content
    AccountSecurity.objects.filter(user=op).update(locked_until=timezone.now())
    r = log_in(client, RIGHT, username="op", path="/admin/login/")
    assert r.status_code == 302 and r["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200


def test_one_address_spraying_many_accounts_is_throttled_while_another_address_is_not(client, settings, ann):
    settings.ACCOUNTS = {**settings.ACCOUNTS, "ADDRESS_LOGIN_FAILURES": 8, "ADDRESS_WINDOW_SECONDS": 600}
    for n in range(8):  # eight names, none of them locked
        assert log_in(client, "x", username=f"someone-{n}", REMOTE_ADDR="198.51.100.1").status_code == 200
    r = log_in(client, RIGHT, REMOTE_ADDR="198.51.100.1")
    assert r.status_code == 429 and 0 < int(r["Retry-After"]) <= 600
    assert b"Too many failed log-ins from your network address" in r.content
    assert log_in(client, RIGHT, REMOTE_ADDR="198.51.100.2").status_code == 302
    assert not AccountSecurity.objects.filter(user=ann, failures__gt=0).exists()  # ann's account was not counted


def test_behind_the_proxy_the_client_address_is_the_one_it_appended(client, settings, ann):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}  # DRF reloads its settings on the change
    settings.ACCOUNTS = {**settings.ACCOUNTS, "ADDRESS_LOGIN_FAILURES": 3}
    for n in range(3):  # a client that forges X-Forwarded-For still has its real address appended by nginx
        log_in(client, "x", username=f"n{n}", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR=f"10.9.9.{n}, 203.0.113.50")
    assert log_in(client, RIGHT, REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.50").status_code == 429
    assert log_in(client, RIGHT, REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.51").status_code == 302


def test_invalid_api_keys_from_one_address_get_429_in_the_error_shape(settings, ann):
    settings.ACCOUNTS = {**settings.ACCOUNTS, "ADDRESS_API_KEY_FAILURES": 5}
    _, good = api_key_create(user=ann, name="script")
    api = APIClient(REMOTE_ADDR="198.51.100.7")
    for n in range(5):
        r = api.get("/api/v1/nodes/", HTTP_AUTHORIZATION=f"Bearer gpm_key_guess{n}")
        assert r.status_code == 401 and r.json()["error"]["message"] == "unknown or revoked API key"
    r = api.get("/api/v1/nodes/", HTTP_AUTHORIZATION=f"Bearer {good}")
    assert r.status_code == 429 and 0 < int(r["Retry-After"]) <= 600
    assert r.json() == {"error": {"code": "throttled", "message": r.json()["error"]["message"]}}
    assert "too many invalid API keys from your address" in r.json()["error"]["message"]
    other = APIClient(REMOTE_ADDR="198.51.100.8")
    assert other.get("/api/v1/nodes/", HTTP_AUTHORIZATION=f"Bearer {good}").status_code == 200


def test_a_log_in_without_redis_still_locks_the_account_in_the_database(settings, ann):
    """The address throttle counts in Redis and lets requests through while it is away; the account's lock is in
    the database and holds."""
    from config.cache import FailOpenRedisCache
    from marketplace.products.accounts import throttle
    from tests.e2e.livestack import free_port

    away = FailOpenRedisCache(f"redis://127.0.0.1:{free_port()}/0",
                              {"OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2}})
    settings.ACCOUNTS = {**settings.ACCOUNTS, "ADDRESS_LOGIN_FAILURES": 2}
    original = throttle.cache
    throttle.cache = away
    try:
        request = RequestFactory().post("/login/", REMOTE_ADDR="198.51.100.9")
        for n in range(5):
            assert authenticate(request, username="ann", password=f"guess-{n}") is None
        assert authenticate(request, username="ann", password=RIGHT) is None
        assert request.login_refusal.code == "locked"  # not "throttled": the address count was not kept
    finally:
        throttle.cache = original


@pytest.mark.skipif("not __import__('os').environ.get('REDIS_URL')", reason="needs Redis: set REDIS_URL (CI does)")
def test_two_web_processes_count_one_address_together_on_redis(settings):
    from django.core.cache import CacheHandler

    from marketplace.products.accounts import throttle

    first, second = CacheHandler(settings.CACHES)["default"], CacheHandler(settings.CACHES)["default"]
    assert first is not second
    limit = throttle.AddressThrottle("login", 3, 600)
    original = throttle.cache
    try:
        throttle.cache = first
        limit.hit(address="192.0.2.77")
        limit.hit(address="192.0.2.77")
        throttle.cache = second
        assert limit.wait(address="192.0.2.77") == 0
        limit.hit(address="192.0.2.77")
        throttle.cache = first
        assert limit.wait(address="192.0.2.77") > 0
    finally:
        throttle.cache = original


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_forty_wrong_passwords_at_once_count_forty_lock_once_and_send_one_email(mailoutbox):
    """On PostgreSQL, from eight threads (each its own connection, as web processes are): the account's row lock
    makes the count exact and exactly one failure the one that locks."""
    UserFactory(username="zed", email="zed@example.org", password=RIGHT)
    refusals, lock = [], threading.Lock()

    def guess(n):
        from django.db import connection

        request = RequestFactory().post("/login/", REMOTE_ADDR=f"198.51.100.{n % 8}")
        try:
            for k in range(5):
                authenticate(request, username="zed", password=f"guess-{n}-{k}")
                with lock:
                    refusals.append(getattr(request, "login_refusal", None))
        finally:
            connection.close()

    threads = [threading.Thread(target=guess, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    row = AccountSecurity.objects.get(user__username="zed")
    assert row.locked_until > timezone.now()
    assert len(mailoutbox) == 1 and mailoutbox[0].to == ["zed@example.org"]
    assert authenticate(RequestFactory().post("/login/"), username="zed", password=RIGHT) is None


def test_websocket_handshakes_with_invalid_keys_count_and_a_throttled_address_gets_no_user(settings, ann):
    from marketplace.api.auth import _resolve

    settings.ACCOUNTS = {**settings.ACCOUNTS, "ADDRESS_API_KEY_FAILURES": 3}
    _, good = api_key_create(user=ann, name="socket")
    assert _resolve(secret=good, address="198.51.100.20").user == ann
    for n in range(3):
        assert _resolve(secret=f"gpm_key_nope{n}", address="198.51.100.20") is None
    assert _resolve(secret=good, address="198.51.100.20") is None
    assert _resolve(secret=good, address="198.51.100.21").user == ann
    assert _resolve(secret=None, address="198.51.100.22") is None  # a browser's handshake: no key, nothing counted


def test_an_operator_lifts_a_lock_in_the_admin(client, ann):
    for n in range(5):
        log_in(client, f"guess-{n}")
    op = UserFactory(username="op", is_staff=True, is_superuser=True)
    client.force_login(op)
    row = AccountSecurity.objects.get(user=ann)
    client.post("/admin/marketplace/accountsecurity/", {"action": "unlock", "_selected_action": [row.pk]})
    client.post("/logout/")
    assert log_in(client, RIGHT).status_code == 302
