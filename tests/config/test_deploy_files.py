"""deploy/ is the production layout docs/deployment.md describes: its units run this checkout's entry points with
the example settings, and those settings pass `check --deploy` and load as production (DEBUG off, TLS on)."""
from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.nodeagent.test_wheel import _exec_start, _unit

DEPLOY = ROOT / "deploy"


def _env_file() -> dict[str, str]:
    lines = (DEPLOY / "market.env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


@pytest.mark.parametrize("unit, program, entry", [
    ("gpumarket-web@.service", "uvicorn", ["config.asgi:application"]),
    ("gpumarket-worker@.service", "celery", ["-A", "config", "worker"]),
    ("gpumarket-beat.service", "celery", ["-A", "config", "beat"]),
])
def test_each_unit_restarts_reads_the_market_settings_and_runs_an_entry_point_of_this_checkout(unit, program, entry):
    service = _unit(DEPLOY / unit)["Service"]
    assert service["Restart"] == ["always"] and service["EnvironmentFile"] == ["/etc/gpumarket/market.env"]
    assert "User" in service  # not root
    argv = _exec_start(service, _env_file())
    assert argv[0] == f"/opt/gpumarket/venv/bin/{program}" and argv[1:1 + len(entry)] == entry
    if program == "uvicorn":
        assert argv[argv.index("--port") + 1] == "%i" and argv[argv.index("--host") + 1] == "127.0.0.1"


def test_the_proxy_passes_websocket_upgrades_to_every_web_process_and_keeps_idle_sockets_open():
    conf = (DEPLOY / "nginx.conf").read_text()
    ws = conf[conf.index("location /ws/"):conf.index("location / ")]
    assert "proxy_set_header Upgrade $http_upgrade;" in ws and "proxy_set_header Connection $connection_upgrade;" in ws
    timeout = re.search(r"proxy_read_timeout (\d+)h;", ws)
    ping = re.search(r"--ws-ping-interval (\d+)", (DEPLOY / "gpumarket-web@.service").read_text())
    # An idle socket outlives the proxy's timeout only through the web process's pings: they must come sooner.
    assert timeout and ping and int(timeout.group(1)) * 3600 > 2 * int(ping.group(1))
    assert "proxy_set_header X-Forwarded-Proto $scheme;" in conf
    assert re.findall(r"server 127\.0\.0\.1:(\d+) max_fails=\d+ fail_timeout=\d+s;", conf) == ["8001", "8002"]
    # The header nginx sets is the one the example settings trust.
    assert _env_file()["DJANGO_SECURE_PROXY_SSL_HEADER"] == "X-Forwarded-Proto: https"


def test_the_example_settings_are_production_and_pass_check_deploy(tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO_"))}
    environ.update(_env_file())
    environ.update({"DJANGO_SECRET_KEY": secrets.token_urlsafe(50), "GPUMARKET_VAR_DIR": str(tmp_path)})
    probe = ("from django.conf import settings as s; print(s.DEBUG, s.SESSION_COOKIE_SECURE, s.SECURE_HSTS_SECONDS > 0,"
             " s.DATABASES['default']['OPTIONS']['pool']['max_size'], s.CACHES['default']['BACKEND'])")
    shown = subprocess.run([sys.executable, "manage.py", "shell", "-v", "0", "-c", probe], cwd=ROOT, env=environ,
                           capture_output=True, text=True, timeout=120)
    assert shown.stdout.split() == ["False", "True", "True", "10", "config.cache.FailOpenRedisCache"], shown.stderr
    check = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=ROOT, env=environ,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr[-3000:]
    assert re.findall(r"security\.W\d+", check.stderr) == ["security.W005", "security.W021"]  # HSTS subdomains and
    # preload: a choice for the domain's owner (docs/deployment.md)
