"""The optional second factor: turned on with a QR code / otpauth URI and a confirming code, asked after the
password by the console and the admin, recovery codes that work once, wrong codes counted toward the lock-out,
turned off with a code."""
from __future__ import annotations

import re
import time
from unittest import mock

import pytest
from django_otp.oath import TOTP
from django_otp.plugins.otp_static.models import StaticDevice
from django_otp.plugins.otp_totp.models import TOTPDevice

from marketplace.models import AccountSecurity
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
RIGHT = "the-right-password"


def code_for(device: TOTPDevice, *, steps_ahead: int = 0) -> str:
    """What the user's app shows (`steps_ahead` 30-second steps later: a code not yet used, within tolerance)."""
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    totp.time = time.time() + steps_ahead * device.step
    return f"{totp.token():0{device.digits}d}"


def turn_on(client, user) -> tuple[TOTPDevice, list[str]]:
    client.force_login(user)
    client.post("/account/two-factor/", {"action": "begin"})
    device = TOTPDevice.objects.get(user=user, confirmed=False)
    r = client.post("/account/two-factor/", {"action": "confirm", "totp-code": code_for(device)})
    codes = re.findall(r"^([a-z2-7]{8})$", re.search(r'id="recovery-codes".*?</pre>', r.content.decode(), re.S).group(0),
                       re.M)
    client.post("/logout/")
    return TOTPDevice.objects.get(pk=device.pk), codes


def test_turning_it_on_shows_a_qr_code_and_the_key_and_takes_a_code_from_the_app(client):
    user = UserFactory(username="ann", password=RIGHT)
    client.force_login(user)
    page = client.get("/account/").content.decode()
    assert 'id="two-factor-state"' in page and ">off<" in page
    r = client.post("/account/two-factor/", {"action": "begin"})
    assert r.status_code == 302
    page = client.get("/account/").content.decode()
    device = TOTPDevice.objects.get(user=user)
    assert not device.confirmed
    assert 'src="data:image/svg+xml' in page and "otpauth://totp/GPU%20Market%3Aann?secret=" in page
    key = re.search(r'id="totp-key">([A-Z2-7 ]+)<', page).group(1).replace(" ", "")
    assert len(key) == 32  # 160 random bits, base32

    r = client.post("/account/two-factor/", {"action": "confirm", "totp-code": "000000"})
    assert r.status_code == 400 and "that code does not match" in r.content.decode()
    device.throttling_failure_timestamp = None  # not the second it just refused: the growing wait is tested below
    device.save()
    r = client.post("/account/two-factor/", {"action": "confirm", "totp-code": code_for(device)})
    assert r.status_code == 200
    page = r.content.decode()
    assert "they are shown only once" in page and len(re.findall(r"^[a-z2-7]{8}$", page, re.M)) == 10
    assert TOTPDevice.objects.get(pk=device.pk).confirmed
    assert ">on<" in client.get("/account/").content.decode()


def test_the_console_asks_for_the_code_after_the_password_and_a_used_code_does_not_pass_twice(client):
    user = UserFactory(username="ann", password=RIGHT)
    device, _ = turn_on(client, user)
    r = client.post("/login/?next=/billing/", {"username": "ann", "password": RIGHT, "next": "/billing/"})
    assert r.status_code == 302 and r["Location"] == "/login/code/"
    assert client.get("/account/").status_code == 302  # not logged in until the code
    r = client.post("/login/code/", {"code": "123456" if code_for(device, steps_ahead=1) != "123456" else "654321"})
    assert r.status_code == 400 and b"That code is not right" in r.content
    code = code_for(device, steps_ahead=1)
    TOTPDevice.objects.filter(pk=device.pk).update(throttling_failure_timestamp=None)
    r = client.post("/login/code/", {"code": code})
    assert r.status_code == 302 and r["Location"] == "/billing/"
    assert client.get("/account/").status_code == 200
    assert AccountSecurity.objects.get(user=user).failures == 0  # the success forgot the wrong code
    client.post("/logout/")
    # The same code again (a replay, or someone who watched it typed) is refused.
    client.post("/login/", {"username": "ann", "password": RIGHT})
    r = client.post("/login/code/", {"code": code})
    assert r.status_code == 400 and client.get("/account/").status_code == 302


def test_a_recovery_code_logs_in_once(client):
    user = UserFactory(username="ann", password=RIGHT)
    _, codes = turn_on(client, user)
    client.post("/login/", {"username": "ann", "password": RIGHT})
    assert client.post("/login/code/", {"code": codes[0].upper()}).status_code == 302
    client.post("/logout/")
    client.post("/login/", {"username": "ann", "password": RIGHT})
    assert client.post("/login/code/", {"code": codes[0]}).status_code == 400
    StaticDevice.objects.filter(user=user).update(throttling_failure_timestamp=None)
    assert client.post("/login/code/", {"code": codes[1]}).status_code == 302
    assert "8 recovery codes left" in client.get("/account/").content.decode()


def test_wrong_codes_count_toward_the_lock_out(client, mailoutbox, django_capture_on_commit_callbacks):
    user = UserFactory(username="ann", email="ann@example.org", password=RIGHT)
    device, _ = turn_on(client, user)
    client.post("/login/", {"username": "ann", "password": RIGHT})
    with django_capture_on_commit_callbacks(execute=True):
        for n in range(5):
            TOTPDevice.objects.filter(pk=device.pk).update(throttling_failure_timestamp=None)
            r = client.post("/login/code/", {"code": f"00000{n}"})
    assert r.status_code == 429 and r["Location"] == "/login/"  # back to the start, the lock said there
    assert AccountSecurity.objects.get(user=user).locked_until is not None and len(mailoutbox) == 1
    r = client.post("/login/", {"username": "ann", "password": RIGHT})
    assert r.status_code == 429 and b"This account is locked" in r.content


def test_a_code_too_late_after_the_password_starts_the_log_in_again(client, settings):
    user = UserFactory(username="ann", password=RIGHT)
    device, _ = turn_on(client, user)
    client.post("/login/", {"username": "ann", "password": RIGHT})
    with mock.patch("marketplace.views.auth.time.time", return_value=time.time() + 301):
        r = client.post("/login/code/", {"code": code_for(device, steps_ahead=1)})
    assert r.status_code == 302 and r["Location"] == "/login/"
    assert client.get("/account/").status_code == 302


def test_the_admin_log_in_asks_for_the_code_too(client):
    op = UserFactory(username="op", password=RIGHT, is_staff=True, is_superuser=True)
    device, _ = turn_on(client, op)
    r = client.post("/admin/login/?next=/admin/", {"username": "op", "password": RIGHT, "next": "/admin/"})
    assert r.status_code == 302 and r["Location"] == "/login/code/"
    assert client.get("/admin/").status_code == 302
    r = client.post("/login/code/", {"code": code_for(device, steps_ahead=1)})
    assert r.status_code == 302 and r["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200


def test_turning_it_off_takes_a_current_code(client):
    user = UserFactory(username="ann", password=RIGHT)
    device, _ = turn_on(client, user)
    client.force_login(user)
    r = client.post("/account/two-factor/", {"action": "disable", "totp-code": "999999"})
    assert r.status_code == 400 and TOTPDevice.objects.filter(user=user).exists()
    TOTPDevice.objects.filter(pk=device.pk).update(throttling_failure_timestamp=None)
    r = client.post("/account/two-factor/", {"action": "disable", "totp-code": code_for(device, steps_ahead=1)})
    assert r.status_code == 302 and not TOTPDevice.objects.filter(user=user).exists()
    client.post("/logout/")
    assert client.post("/login/", {"username": "ann", "password": RIGHT}).status_code == 302
    assert client.get("/account/").status_code == 200


def test_wrong_codes_in_a_row_make_the_next_one_wait(client):
    user = UserFactory(username="ann", password=RIGHT)
    device, _ = turn_on(client, user)
    client.force_login(user)
    client.post("/account/two-factor/", {"action": "recovery", "totp-code": "111111"})
    r = client.post("/account/two-factor/", {"action": "recovery", "totp-code": code_for(device, steps_ahead=1)})
    assert r.status_code == 400 and "too many wrong codes: wait" in r.content.decode()
