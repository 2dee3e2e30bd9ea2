"""E-mail settings come from the environment through strict helpers: SMTP in production, a file per message (the
demo) without EMAIL_HOST; malformed or contradictory values stop start-up naming the variable."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from config import env
from tests.conftest import ROOT

PROBE = ("from django.conf import settings as s; print(s.EMAIL_BACKEND, s.EMAIL_HOST, s.EMAIL_PORT, s.EMAIL_USE_TLS, "
         "s.DEFAULT_FROM_EMAIL, sep='|')")


def start(tmp_path, **variables):
    environ = {k: v for k, v in os.environ.items()
               if k not in ("DATABASE_URL", "REDIS_URL") and not k.startswith(("EMAIL_", "DEFAULT_FROM_EMAIL"))}
    environ.update({"DJANGO_SETTINGS_MODULE": "config.settings.dev", "GPUMARKET_VAR_DIR": str(tmp_path), **variables})
    return subprocess.run([sys.executable, "manage.py", "shell", "-v", "0", "-c", PROBE], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120)


def test_production_sends_through_smtp_and_the_demo_writes_files(tmp_path):
    out = start(tmp_path, EMAIL_HOST="smtp.example.org", EMAIL_PORT="465", EMAIL_USE_TLS="1",
                DEFAULT_FROM_EMAIL="GPU Market <market@example.org>")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("django.core.mail.backends.smtp.EmailBackend|smtp.example.org|465|True|"
                                  "GPU Market <market@example.org>")
    out = start(tmp_path)
    assert out.stdout.startswith("django.core.mail.backends.filebased.EmailBackend|None|587|False|")


@pytest.mark.parametrize("variables, named", [
    ({"EMAIL_HOST": "smtp.example.org", "EMAIL_USE_TLS": "1", "EMAIL_USE_SSL": "1"}, "EMAIL_USE_SSL"),
    ({"EMAIL_BACKEND": "smtp"}, "EMAIL_BACKEND"),
    ({"EMAIL_BACKEND": "pigeon"}, "EMAIL_BACKEND"),
    ({"EMAIL_PORT": "smtp"}, "EMAIL_PORT"),
    ({"DEFAULT_FROM_EMAIL": "GPU Market"}, "DEFAULT_FROM_EMAIL"),
])
def test_start_up_stops_on_malformed_or_contradictory_email_settings(tmp_path, variables, named):
    out = start(tmp_path, **variables)
    assert out.returncode == 2 and f"environment variable {named}" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("value, ok", [("noreply@example.org", True), ("GPU Market <noreply@example.org>", True),
                                       ("noreply@localhost", True), ("noreply", False), ("a@b@c.org", False),
                                       ("Name noreply@example.org", False)])
def test_sender_addresses_are_checked(monkeypatch, value, ok):
    monkeypatch.setenv("X_FROM", value)
    if ok:
        assert env.env_email("X_FROM", "x@example.org") == value
    else:
        with pytest.raises(env.ImproperlyConfiguredEnv):
            env.env_email("X_FROM", "x@example.org")


def test_the_demo_says_where_the_mail_it_does_not_send_goes(settings, tmp_path):
    from marketplace.management.commands.demo import mail_said

    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = str(tmp_path / "mail")
    assert mail_said() == (f"e-mail is not sent: each message is written as a file under {tmp_path}/mail/ (open it "
                           f"for the confirmation link; set EMAIL_HOST to send mail)")
    settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT = ("django.core.mail.backends.smtp.EmailBackend",
                                                                        "smtp.example.org", 587)
    assert mail_said() == "e-mail is sent through smtp.example.org:587"
