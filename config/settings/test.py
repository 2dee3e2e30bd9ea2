"""Tests: the same strict settings, a fixed secret, fast password hashing, eager Celery."""
import os

os.environ.setdefault("DJANGO_SECRET_KEY", "test-secret-key-not-for-production")
os.environ.setdefault("DJANGO_DEBUG", "0")

from .base import *  # noqa: E402,F401,F403
from .base import ACCOUNTS, DATABASES, MARKET, REST_FRAMEWORK  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
# Tests read what they just wrote: no shared snapshot outlives a call (tests of the cache set their own TTL).
# The same for the learnt demand mix (claims/demand.py): every snapshot reads the orders again.
MARKET = {**MARKET, "SNAPSHOT_TTL_SECONDS": 0.0, "DEMAND_MIX_TTL_SECONDS": 0.0}
REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"user": "100000/min", "anon": "100000/min"}}
# Per-address throttles out of the way of tests that fail a log-in or send a bad key now and then from the test
# client's one address; tests/accounts sets the numbers it checks.
ACCOUNTS = {**ACCOUNTS, "ADDRESS_LOGIN_FAILURES": 100_000, "ADDRESS_API_KEY_FAILURES": 100_000,
            "ADDRESS_MAILS_PER_HOUR": 100_000}
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    # Connections held by worker threads (database_sync_to_async) would keep the test database open.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # One test database per run, so parallel runs on one server do not drop each other's.
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}
elif DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # pytest-django creates its own test database; keep the demo's file out of it.
    DATABASES["default"]["TEST"] = {"NAME": ":memory:"}
    DATABASES["default"]["OPTIONS"] = {"timeout": 20}
STORAGES = {"staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
            "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"}}
