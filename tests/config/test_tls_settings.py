"""Production behind a TLS proxy is configured from the environment: `check --deploy` clears, and the agent
command the console prints says wss:// when the proxy says the request came over https."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from tests.conftest import ROOT

TLS_WARNINGS = ("security.W004", "security.W008", "security.W012", "security.W016")

AGENT_COMMAND = """
from django.test import RequestFactory
from scheduler.api import agent_command_line
request = RequestFactory().get("/", HTTP_HOST="market.example.org", HTTP_X_FORWARDED_PROTO="https")
print(agent_command_line(request, "gpm_node_x"))
"""


def _manage(tmp_path, *argv: str, **environ: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings.base", "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
                "DJANGO_ALLOWED_HOSTS": "market.example.org", "GPUMARKET_VAR_DIR": str(tmp_path), **environ})
    return subprocess.run([sys.executable, "manage.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("environ", [
    {"DJANGO_TLS": "1"},
    {"DJANGO_SECURE_HSTS_SECONDS": "3600", "DJANGO_SECURE_SSL_REDIRECT": "1", "DJANGO_SECURE_COOKIES": "1"},
])
def test_check_deploy_is_clear_of_the_tls_warnings_when_the_environment_says_tls(tmp_path, environ):
    without = _manage(tmp_path, "check", "--deploy")
    assert all(w in without.stderr for w in TLS_WARNINGS), without.stderr[-3000:]  # the production defaults
    proc = _manage(tmp_path, "check", "--deploy", **environ)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [w for w in TLS_WARNINGS if w in proc.stderr + proc.stdout] == []


def test_behind_the_tls_proxy_the_agent_command_says_wss_and_keeps_the_token_off_the_command_line(tmp_path):
    plain = _manage(tmp_path, "shell", "-v", "0", "-c", AGENT_COMMAND)
    assert plain.stdout.strip().endswith("--server ws://market.example.org/ws/agent/"), plain.stderr[-2000:]
    proxied = _manage(tmp_path, "shell", "-v", "0", "-c", AGENT_COMMAND, DJANGO_TLS="1",
                      DJANGO_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https")
    assert proxied.stdout.strip() == ("NODEAGENT_TOKEN=gpm_node_x python -m nodeagent "
                                      "--server wss://market.example.org/ws/agent/"), proxied.stderr[-2000:]
