"""DEBUG is never on unless a developer sets DJANGO_DEBUG=1: not in production's settings, not in the demo's (whose
error pages are the product's, and whose secret key is made once per var/ folder, never one in the repository)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROBE = ("import django; django.setup(); from django.conf import settings as s; "
         "print(s.DEBUG, s.SECRET_KEY, s.WEBHOOKS_ALLOW_LOOPBACK)")


def _settings(module: str, tmp_path, **extra) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_DEBUG", "DJANGO_SECRET_KEY")}
    environ.update({"DJANGO_SETTINGS_MODULE": module, "GPUMARKET_VAR_DIR": str(tmp_path), **extra})
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=60)


def test_the_demos_settings_keep_debug_off_with_a_secret_made_once_for_its_var_folder(tmp_path):
    first = _settings("config.settings.dev", tmp_path)
    debug, secret, loopback = first.stdout.split()
    assert debug == "False" and loopback == "True" and len(secret) >= 50, first.stderr
    assert (tmp_path / "demo-secret-key").read_text().strip() == secret
    again = _settings("config.settings.dev", tmp_path)
    assert again.stdout.split()[1] == secret  # web, worker and beat (and a restart) share it
    other = _settings("config.settings.dev", tmp_path / "elsewhere")
    assert other.stdout.split()[1] != secret


def test_production_settings_keep_debug_off_and_refuse_to_start_without_a_secret(tmp_path):
    shown = _settings("config.settings.base", tmp_path, DJANGO_SECRET_KEY="x" * 50)
    assert shown.stdout.split() == ["False", "x" * 50, "False"], shown.stderr
    refused = _settings("config.settings.base", tmp_path)
    assert refused.returncode != 0 and "DJANGO_SECRET_KEY" in refused.stderr


@pytest.mark.parametrize("module", ["config.settings.dev", "config.settings.base"])
def test_debug_is_on_only_when_a_developer_asks(module, tmp_path):
    shown = _settings(module, tmp_path, DJANGO_DEBUG="1", DJANGO_SECRET_KEY="y" * 50)
    assert shown.stdout.split()[0] == "True", shown.stderr
