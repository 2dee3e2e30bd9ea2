"""Every setting read from the environment is strict: these malformed values once slipped through (or
failed later, or failed without naming the variable)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from config import env
from tests.conftest import ROOT


@pytest.mark.parametrize("var, value", [
    ("FLEET_CORDON_XIDS", "48,abc"),  # was a bare ValueError from int()
    ("FLEET_HEARTBEAT_TIMEOUT", "inf"),  # was accepted; timedelta(seconds=inf) fails in the beat task
    ("API_THROTTLE_USER", "lots"),  # was accepted; DRF failed on the first API request
    ("LOG_LEVEL", "LOUD"),  # was a logging ValueError not naming the variable
    ("PLATFORM_FEE_RATE", "1.5"),  # a fee above the price
    ("MARKET_RESALE_CAP", "2"),  # resale above the on-demand price
])
def test_start_up_stops_with_a_message_naming_a_malformed_variable(var, value, tmp_path):
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environ.update({var: value, "DJANGO_SETTINGS_MODULE": "config.settings.dev", "GPUMARKET_VAR_DIR": str(tmp_path)})
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"environment variable {var}" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("value, fn, kwargs, expected", [
    ("48, 79", env.env_int_list, {"default": []}, [48, 79]),
    ("100/min", env.env_rate, {"default": "1/s"}, "100/min"),
    ("2/second", env.env_rate, {"default": "1/s"}, "2/second"),
    ("debug", env.env_log_level, {"default": "INFO"}, "DEBUG"),
    ("1", env.env_decimal, {"default": "0.1", "maximum": 1}, 1),
])
def test_well_formed_values_of_the_stricter_helpers_are_read(monkeypatch, value, fn, kwargs, expected):
    monkeypatch.setenv("X_OK", value)
    assert fn("X_OK", **kwargs) == expected


@pytest.mark.parametrize("value", ["inf", "-inf", "1e400"])
def test_an_infinite_float_is_refused(monkeypatch, value):
    monkeypatch.setenv("X_BAD", value)
    with pytest.raises(env.ImproperlyConfiguredEnv, match="X_BAD"):
        env.env_float("X_BAD", 1.0, minimum=0)
