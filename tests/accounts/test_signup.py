"""Sign-up with e-mail confirmation, the link sent again, log-in by username or e-mail, password change and reset:
the console's pages through Django's test client, the mail through Django's SMTP backend to a real SMTP server."""
from __future__ import annotations

import time
from unittest import mock
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from marketplace.models import AccountSecurity
from marketplace.products.accounts import signup
from tests.factories import UserFactory
from tests.mailserver import body, link_in

pytestmark = pytest.mark.django_db
User = get_user_model()
PASSWORD = "a-long-pass-phrase"


def sign_up(client, capture, *, username="ann", email="Ann@Example.org", password=PASSWORD, password2=None):
    with capture(execute=True):
        return client.post("/signup/", {"username": username, "email": email, "password": password,
                                        "password2": password2 or password})


def path_of(url: str) -> str:
    return urlsplit(url).path


def test_a_visitor_signs_up_confirms_the_link_from_the_mail_and_logs_in_by_email_or_username(
        client, smtp, django_capture_on_commit_callbacks):
    r = sign_up(client, django_capture_on_commit_callbacks)
    assert r.status_code == 302 and r["Location"] == "/signup/sent/"
    user = User.objects.get(username="ann")
    assert not user.is_active and user.email == "Ann@example.org"  # the domain lower-cased, the rest as typed
    assert AccountSecurity.objects.get(user=user).awaits_confirmation
    page = client.get("/signup/sent/").content.decode()
    assert "Ann@example.org" in page

    message = smtp.wait_for("Ann@example.org", subject="Confirm your e-mail")
    link = link_in(message, "/signup/confirm/")
    assert link.startswith("http://testserver/signup/confirm/") and "It works for 72 hours" in body(message)

    # Before the link: the right password says what to do, a wrong one says nothing about the account.
    r = client.post("/login/", {"username": "ann", "password": PASSWORD})
    assert r.status_code == 200 and "Confirm your e-mail address first" in r.content.decode()
    assert "A…@example.org" in r.content.decode() and b"Send the confirmation link again" in r.content
    r = client.post("/login/", {"username": "ann", "password": "wrong-wrong"})
    assert b"Wrong username, e-mail or password." in r.content and b"Confirm your" not in r.content

    # The link shows a button (a mail scanner fetching it confirms nothing); the button confirms.
    assert client.get(path_of(link)).status_code == 200
    assert not User.objects.get(pk=user.pk).is_active
    r = client.post(path_of(link))
    assert r.status_code == 302 and r["Location"] == "/login/?username=ann"
    assert User.objects.get(pk=user.pk).is_active
    assert b'value="ann"' in client.get(r["Location"]).content

    r = client.post("/login/", {"username": "ANN@example.ORG", "password": PASSWORD})
    assert r.status_code == 302 and client.get("/account/").status_code == 200
    client.post("/logout/")
    r = client.post("/login/", {"username": "ann", "password": PASSWORD})
    assert r.status_code == 302

    # The link again: already confirmed, nothing changes.
    r = client.post(path_of(link), follow=True)
    assert b"confirmed already" in r.content


def test_emails_and_usernames_are_taken_case_insensitively_and_bad_input_is_said_beside_its_field(
        client, django_capture_on_commit_callbacks, mailoutbox):
    UserFactory(username="Bob", email="bob@example.org")
    cases = [({"email": "BOB@example.org"}, "email", "an account with this e-mail address exists"),
             ({"username": "bob"}, "username", "that username is taken"),
             ({"username": "a@b"}, "username", "no @"),
             ({"email": "not-an-address"}, "email", "Enter a valid email address"),
             ({"password": "short"}, "password", "too short"),
             ({"password2": "another-long-one"}, "password2", "The two passwords differ")]
    for change, field, said in cases:
        data = {"username": "newbie", "email": "new@example.org", "password": PASSWORD, **change}
        r = sign_up(client, django_capture_on_commit_callbacks, **data)
        assert r.status_code == 400, (change, r.status_code)
        assert said in r.context["form"].errors[field][0], (change, r.context["form"].errors)
    assert not User.objects.filter(username="newbie").exists() and mailoutbox == []


def test_the_database_refuses_a_second_account_with_the_same_email_in_another_case():
    UserFactory(username="c1", email="carol@example.org")
    with pytest.raises(IntegrityError), transaction.atomic():
        UserFactory(username="c2", email="CAROL@example.org")
    UserFactory(username="c3", email="")  # accounts without an address are many
    UserFactory(username="c4", email="")


def test_an_expired_forged_or_outdated_link_is_refused_and_offers_a_new_one(client, django_capture_on_commit_callbacks,
                                                                           mailoutbox):
    sign_up(client, django_capture_on_commit_callbacks, username="dan", email="dan@example.org")
    user = User.objects.get(username="dan")
    token = signup.confirmation_token(user)
    later = time.time() + 3 * 86400 + 5
    with mock.patch("django.core.signing.time.time", return_value=later):
        r = client.post(f"/signup/confirm/{token}/")
    assert r.status_code == 400 and b"This link has expired" in r.content and b"Send a new link" in r.content
    r = client.post(f"/signup/confirm/{token[:-2]}xx/")
    assert r.status_code == 400 and b"This link is not valid" in r.content
    User.objects.filter(pk=user.pk).update(email="dan2@example.org")  # the address changed since the link
    r = client.post(f"/signup/confirm/{token}/")
    assert r.status_code == 400 and not User.objects.get(pk=user.pk).is_active


def test_the_link_is_sent_again_only_to_an_account_awaiting_it_and_the_page_says_the_same_either_way(
        client, smtp, django_capture_on_commit_callbacks):
    sign_up(client, django_capture_on_commit_callbacks, username="eve", email="eve@example.org")
    smtp.wait_for("eve@example.org")
    UserFactory(username="frank", email="frank@example.org")  # active, no confirmation pending
    for address in ("eve@example.org", "frank@example.org", "nobody@example.org"):
        with django_capture_on_commit_callbacks(execute=True):
            r = client.post("/signup/sent/", {"email": address}, follow=True)
        assert b"If an account awaits confirmation at that address" in r.content
    second = smtp.wait_for("eve@example.org", count=2)
    assert "/signup/confirm/" in body(second)
    assert smtp.to("frank@example.org") == [] and smtp.to("nobody@example.org") == []
    # Both links work until they expire: the first confirms.
    first = link_in(smtp.to("eve@example.org")[0], "/signup/confirm/")
    client.post(path_of(first))
    assert User.objects.get(username="eve").is_active


def test_sign_ups_and_mails_asked_for_from_one_address_are_throttled(client, settings,
                                                                     django_capture_on_commit_callbacks, mailoutbox):
    settings.ACCOUNTS = {**settings.ACCOUNTS, "ADDRESS_MAILS_PER_HOUR": 2}
    for n in range(2):
        assert sign_up(client, django_capture_on_commit_callbacks, username=f"u{n}",
                       email=f"u{n}@example.org").status_code == 302
    r = sign_up(client, django_capture_on_commit_callbacks, username="u9", email="u9@example.org")
    assert r.status_code == 429 and int(r["Retry-After"]) > 0
    assert b"Too many e-mails asked for from your network address" in r.content
    assert not User.objects.filter(username="u9").exists()
    r = client.post("/signup/sent/", {"email": "u0@example.org"})
    assert r.status_code == 429
    r = client.post("/password/reset/", {"email": "u0@example.org"})
    assert r.status_code == 429
    # Another address is not held back.
    r = client.post("/signup/", {"username": "u8", "email": "u8@example.org", "password": PASSWORD,
                                 "password2": PASSWORD}, REMOTE_ADDR="203.0.113.9")
    assert r.status_code == 302 and len(mailoutbox) <= 3


def test_a_forgotten_password_is_reset_through_the_mailed_link_once(client, smtp):
    UserFactory(username="gus", email="gus@example.org", password="old-password-1")
    r = client.post("/password/reset/", {"email": "GUS@example.org"})
    assert r.status_code == 302 and r["Location"] == "/password/reset/sent/"
    link = link_in(smtp.wait_for("gus@example.org", subject="Reset your GPU Market password"), "/password/reset/")
    r = client.get(path_of(link), follow=True)  # Django moves the token into the session
    form_path = r.redirect_chain[-1][0]
    r = client.post(form_path, {"new_password1": "new-password-22", "new_password2": "new-password-22"})
    assert r.status_code == 302 and r["Location"] == "/password/reset/done/"
    assert client.post("/login/", {"username": "gus", "password": "new-password-22"}).status_code == 302
    client.post("/logout/")
    r = client.get(path_of(link), follow=True)
    assert b"This link does not work any more" in r.content


def test_a_logged_in_user_changes_the_password_on_the_console(client):
    user = UserFactory(username="hal", password="old-password-1")
    client.force_login(user)
    r = client.get("/account/")
    assert b'href="/password/change/"' in r.content
    r = client.post("/password/change/", {"old_password": "nope", "new_password1": "x", "new_password2": "x"})
    assert r.status_code == 200 and "old password was entered incorrectly" in r.content.decode()
    r = client.post("/password/change/", {"old_password": "old-password-1", "new_password1": "new-password-22",
                                          "new_password2": "new-password-22"})
    assert r.status_code == 302 and r["Location"] == "/password/change/done/"
    user.refresh_from_db()
    assert user.check_password("new-password-22")


@pytest.mark.parametrize("path", ["/login/", "/signup/", "/signup/sent/", "/password/reset/",
                                  "/password/reset/sent/", "/admin/login/"])
def test_the_pages_of_logged_out_visitors_have_titles(client, path):
    import re

    r = client.get(path)
    assert r.status_code == 200
    title = re.search(r"<title>(.*?)</title>", r.content.decode(), re.S).group(1)
    assert "<" not in title and title.strip().endswith("· GPU Market")


def test_an_operator_giving_an_account_an_address_another_has_is_told_beside_the_field(client):
    UserFactory(username="ivy", email="ivy@example.org")
    other = UserFactory(username="jon", email="jon@example.org")
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    page = client.get(f"/admin/auth/user/{other.pk}/change/")
    assert page.status_code == 200
    data = {"username": "jon", "email": "IVY@example.org", "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00",
            "is_active": "on"}
    r = client.post(f"/admin/auth/user/{other.pk}/change/", data)
    assert r.status_code == 200 and "Another account has this e-mail address." in r.content.decode()
    other.refresh_from_db()
    assert other.email == "jon@example.org"
