"""Settings come from the environment and a malformed value stops start-up naming the variable."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from config import env
from tests.conftest import ROOT


@pytest.mark.parametrize("name, value, fn, kwargs, expected", [
    ("X_BOOL", "yes", env.env_bool, {"default": False}, True),
    ("X_BOOL", "0", env.env_bool, {"default": True}, False),
    ("X_INT", "42", env.env_int, {"default": 1}, 42),
    ("X_FLOAT", "2.5", env.env_float, {"default": 1.0}, 2.5),
    ("X_LIST", "a, b,,c", env.env_list, {"default": []}, ["a", "b", "c"]),
    ("X_UNSET", None, env.env_int, {"default": 7}, 7),
])
def test_well_formed_values_are_read(monkeypatch, name, value, fn, kwargs, expected):
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    assert fn(name, **kwargs) == expected


@pytest.mark.parametrize("value, fn, kwargs", [
    ("maybe", env.env_bool, {"default": False}),
    ("4x", env.env_int, {"default": 1}),
    ("0", env.env_int, {"default": 1, "minimum": 1}),
    ("nan", env.env_float, {"default": 1.0}),
    ("12", env.env_float, {"default": 1.0, "maximum": 10}),
])
def test_malformed_values_raise_naming_the_variable(monkeypatch, value, fn, kwargs):
    monkeypatch.setenv("X_BAD", value)
    with pytest.raises(env.ImproperlyConfiguredEnv) as err:
        fn("X_BAD", **kwargs)
    assert "X_BAD" in str(err.value)


@pytest.mark.parametrize("url, engine, name", [
    ("postgres://u:p%40ss@db.internal:5433/market?sslmode=require", "django.db.backends.postgresql", "market"),
    ("sqlite:///var/x.db", "django.db.backends.sqlite3", "var/x.db"),
])
def test_database_urls_are_parsed(url, engine, name):
    db = env.database_from_url("DATABASE_URL", url)
    assert db["ENGINE"] == engine and db["NAME"] == name
    if "postgres" in url:
        assert (db["PASSWORD"], db["PORT"], db["OPTIONS"]["sslmode"]) == ("p@ss", "5433", "require")


def test_postgres_connections_come_from_a_pool_sized_by_the_environment(monkeypatch):
    monkeypatch.setenv("DB_POOL_MIN", "1")
    monkeypatch.setenv("DB_POOL_MAX", "4")
    monkeypatch.setenv("DB_POOL_TIMEOUT", "2.5")
    db = env.database_from_url("DATABASE_URL", "postgres://db/market", pool=env.DbPool.from_env())
    pool = db["OPTIONS"]["pool"]
    assert (pool["min_size"], pool["max_size"], pool["timeout"]) == (1, 4, 2.5)
    # Django refuses a pool with persistent connections; each request hands its connection back instead.
    assert db["CONN_MAX_AGE"] == 0 and not db["DISABLE_SERVER_SIDE_CURSORS"]


def test_no_pool_means_a_pgbouncer_in_transaction_mode_pools(monkeypatch):
    monkeypatch.setenv("DB_POOL_MAX", "0")
    db = env.database_from_url("DATABASE_URL", "postgres://pgbouncer:6432/market", pool=env.DbPool.from_env())
    assert "pool" not in db["OPTIONS"] and db["CONN_MAX_AGE"] == 0 and db["DISABLE_SERVER_SIDE_CURSORS"]


@pytest.mark.parametrize("environ, var", [
    ({"DB_POOL_MIN": "5", "DB_POOL_MAX": "2"}, "DB_POOL_MIN"), ({"DB_POOL_MAX": "-1"}, "DB_POOL_MAX"),
    ({"DB_POOL_TIMEOUT": "0"}, "DB_POOL_TIMEOUT"),
])
def test_a_pool_that_cannot_work_is_refused_naming_the_variable(monkeypatch, environ, var):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(env.ImproperlyConfiguredEnv, match=var):
        env.DbPool.from_env()


@pytest.mark.parametrize("value, expected", [
    ("X-Forwarded-Proto: https", ("HTTP_X_FORWARDED_PROTO", "https")), ("", None),
])
def test_the_proxys_https_header_is_read_as_django_wants_it(monkeypatch, value, expected):
    monkeypatch.setenv("X_PROXY", value)
    assert env.proxy_ssl_header("X_PROXY") == expected


def test_a_malformed_proxy_header_is_refused(monkeypatch):
    monkeypatch.setenv("X_PROXY", "https")
    with pytest.raises(env.ImproperlyConfiguredEnv, match="X_PROXY"):
        env.proxy_ssl_header("X_PROXY")


@pytest.mark.parametrize("url", ["mysql://x/y", "postgres://host", "postgres://h:notaport/db", "sqlite://"])
def test_bad_database_urls_are_refused(url):
    with pytest.raises(env.ImproperlyConfiguredEnv, match="DATABASE_URL"):
        env.database_from_url("DATABASE_URL", url)


@pytest.mark.parametrize("var, value", [
    ("DATABASE_URL", "mysql://nope/db"),
    ("REDIS_URL", "http://127.0.0.1:6379"),
    ("FLEET_HEARTBEAT_TIMEOUT", "soon"),
    ("DJANGO_DEBUG", "perhaps"),
])
def test_start_up_stops_with_a_message_naming_a_malformed_variable(var, value, tmp_path):
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environ.update({var: value, "DJANGO_SETTINGS_MODULE": "config.settings.dev", "GPUMARKET_VAR_DIR": str(tmp_path)})
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert f"environment variable {var}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_with_nothing_set_the_embedded_defaults_are_used(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environ.update({"DJANGO_SETTINGS_MODULE": "config.settings.dev", "GPUMARKET_VAR_DIR": str(tmp_path)})
    code = ("from django.conf import settings as s; import django; django.setup();"
            "print(s.DATABASES['default']['ENGINE'], s.CHANNEL_LAYERS['default']['BACKEND'], s.CELERY_BROKER_URL)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["django.db.backends.sqlite3", "config.channel_layers.FastInMemoryChannelLayer", "filesystem://"]
    environ.update({"DATABASE_URL": "postgres://u@127.0.0.1:5432/x", "REDIS_URL": "redis://127.0.0.1:6379/3"})
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["django.db.backends.postgresql", "channels_redis.core.RedisChannelLayer",
                                  "redis://127.0.0.1:6379/3"]
