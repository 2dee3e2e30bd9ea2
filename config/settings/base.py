"""Settings for every environment, read from the environment through strict helpers (config.env).

With nothing set: SQLite, the in-memory channel layer and Celery on an embedded filesystem broker (no
Redis needed). DATABASE_URL → PostgreSQL; REDIS_URL → Redis channel layer and Celery broker.
"""
from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from config.env import (DbPool, ImproperlyConfiguredEnv, database_from_url, env_bool, env_choice, env_decimal, env_email, env_float, env_int,
                        env_int_list, env_list, env_log_level, env_rate, env_str, proxy_ssl_header, redis_url)

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(env_str("GPUMARKET_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = env_str("DJANGO_SECRET_KEY") or ("insecure-dev-key-change-me" if DEBUG else None)
if not SECRET_KEY:
    raise ImproperlyConfiguredEnv("DJANGO_SECRET_KEY", "must be set when DJANGO_DEBUG is off")
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# --- TLS (docs/deployment.md) ------------------------------------------------------------------
# DJANGO_TLS=1: the site is served over HTTPS only (behind the reverse proxy that ends TLS). It turns on HSTS,
# the redirect to https:// and secure cookies; each can still be set on its own.
_tls = env_bool("DJANGO_TLS", False)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", _tls)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31_536_000 if _tls else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", _tls)
# The proxy's header saying the client's request was https (e.g. "X-Forwarded-Proto: https"): without it a
# request that reached the proxy over TLS looks like plain HTTP here (the agent command would say ws://, and
# SECURE_SSL_REDIRECT would loop). Set it only behind a proxy that overwrites that header from clients.
SECURE_PROXY_SSL_HEADER = proxy_ssl_header("DJANGO_SECURE_PROXY_SSL_HEADER")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "django_otp",  # the optional second factor (TOTP) and its recovery codes: docs/accounts.md
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    "scheduler.apps.SchedulerConfig",
    "marketplace.apps.MarketplaceConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [BASE_DIR / "templates"],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]

_database_url = env_str("DATABASE_URL")
DATABASES = {"default": database_from_url("DATABASE_URL", _database_url, pool=DbPool.from_env()) if _database_url else {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": str(VAR_DIR / "db.sqlite3"),
    # WAL and a busy timeout let web, worker and beat share one SQLite file in the demo.
    "OPTIONS": {"timeout": 20, "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE"},
}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "console:home"
LOGOUT_REDIRECT_URL = "login"
# Log in by username or e-mail; refuses locked accounts and throttled addresses (marketplace/backends.py): the
# console, the admin (which logs in through the console's page) and anything else that calls authenticate().
AUTHENTICATION_BACKENDS = ["marketplace.backends.AccountBackend"]
OTP_TOTP_ISSUER = "GPU Market"

# --- Accounts: sign-up, lock-out, throttles (docs/accounts.md) -------------------------------------
# Reverse proxies in front of the web processes that append the client's address to X-Forwarded-For (one behind
# deploy/nginx.conf). 0: the connection's own address. Log-in and API-key throttles count per client address,
# and so do the API's anonymous throttles: behind a proxy left at 0 every client would share the proxy's address.
NUM_PROXIES = env_int("DJANGO_NUM_PROXIES", 0, minimum=0, maximum=10)
ACCOUNTS = {
    # An account is locked for LOCKOUT_SECONDS after LOCKOUT_FAILURES failed log-ins (wrong password or second
    # factor) within LOCKOUT_WINDOW_SECONDS, and its owner gets an e-mail.
    "LOCKOUT_FAILURES": env_int("ACCOUNTS_LOCKOUT_FAILURES", 5, minimum=1, maximum=1000),
    "LOCKOUT_WINDOW_SECONDS": env_int("ACCOUNTS_LOCKOUT_WINDOW_SECONDS", 900, minimum=1, maximum=86400),
    "LOCKOUT_SECONDS": env_int("ACCOUNTS_LOCKOUT_SECONDS", 900, minimum=1, maximum=7 * 86400),
    # One client address: failed log-ins (any accounts, known or not) and invalid API keys, each per window.
    "ADDRESS_LOGIN_FAILURES": env_int("ACCOUNTS_ADDRESS_LOGIN_FAILURES", 20, minimum=1, maximum=10**6),
    "ADDRESS_API_KEY_FAILURES": env_int("ACCOUNTS_ADDRESS_API_KEY_FAILURES", 20, minimum=1, maximum=10**6),
    "ADDRESS_WINDOW_SECONDS": env_int("ACCOUNTS_ADDRESS_WINDOW_SECONDS", 600, minimum=1, maximum=86400),
    # E-mails one client address may have sent per hour: sign-ups, confirmation links again, password resets.
    "ADDRESS_MAILS_PER_HOUR": env_int("ACCOUNTS_ADDRESS_MAILS_PER_HOUR", 10, minimum=1, maximum=10**6),
    "CONFIRM_LINK_SECONDS": env_int("ACCOUNTS_CONFIRM_LINK_SECONDS", 3 * 86400, minimum=60, maximum=30 * 86400),
    # Between the password and the second factor's code.
    "SECOND_FACTOR_SECONDS": env_int("ACCOUNTS_SECOND_FACTOR_SECONDS", 300, minimum=30, maximum=3600),
}

# --- E-mail (docs/accounts.md): sign-up links, password resets, lock-out notices -----------------
# EMAIL_HOST set: SMTP through it. Unset: each message is written as a file under var/mail/ (the demo prints where).
EMAIL_HOST = env_str("EMAIL_HOST")
_email_via = env_choice("EMAIL_BACKEND", "smtp" if EMAIL_HOST else "file", ("smtp", "file", "console"))
if _email_via == "smtp" and not EMAIL_HOST:
    from config.env import ImproperlyConfiguredEnv

    raise ImproperlyConfiguredEnv("EMAIL_BACKEND", "smtp needs EMAIL_HOST")
EMAIL_BACKEND = {"smtp": "django.core.mail.backends.smtp.EmailBackend",
                 "file": "django.core.mail.backends.filebased.EmailBackend",
                 "console": "django.core.mail.backends.console.EmailBackend"}[_email_via]
EMAIL_FILE_PATH = str(VAR_DIR / "mail")
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)  # STARTTLS (port 587)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)  # TLS from the first byte (port 465)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    from config.env import ImproperlyConfiguredEnv

    raise ImproperlyConfiguredEnv("EMAIL_USE_SSL", "EMAIL_USE_TLS and EMAIL_USE_SSL exclude each other: pick one")
EMAIL_TIMEOUT = env_float("EMAIL_TIMEOUT", 10.0, minimum=0.5, maximum=300)
DEFAULT_FROM_EMAIL = env_email("DEFAULT_FROM_EMAIL", "GPU Market <noreply@localhost>")
SERVER_EMAIL = env_email("SERVER_EMAIL", DEFAULT_FROM_EMAIL)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
WHITENOISE_USE_FINDERS = True  # serve from static/ without a collectstatic step in the demo

# --- Redis: channel layer and Celery broker -----------------------------------------------------
REDIS_URL = redis_url("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {"default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py's asyncio pool holds 100 connections by default and raises when they are all busy; a web
        # process with hundreds of agent and console sockets has more group sends than that in flight.
        # A socket timeout well above the layer's 5 s blocking receive (BZPOPMIN): redis-py 8 defaults to 5 s, which
        # races the server's own 5 s answer and closed busy sockets every few seconds ("Timeout reading").
        "CONFIG": {"hosts": [{"address": REDIS_URL,
                              "max_connections": env_int("REDIS_MAX_CONNECTIONS", 2000, minimum=10),
                              "socket_timeout": 30, "socket_connect_timeout": 5}],
                   "capacity": 2000, "expiry": 30},
    }}
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "config.channel_layers.FastInMemoryChannelLayer",
                                  "CONFIG": {"capacity": 2000, "expiry": 30}}}
    # The embedded broker (config/broker.py): messages are files under var/celery, shared by web, worker and
    # beat; every step another process can see is one atomic rename, and a dead worker's messages come back.
    from config.broker import broker_folders

    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT = "config.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = broker_folders(VAR_DIR / "celery")
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_ACKS_LATE = True  # tasks are guarded by state checks, so a redelivery is harmless
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_TIMEZONE = "UTC"

# --- Cache: the API's throttles ------------------------------------------------------------------
# On Redis one count for every web process, in the same database under its own key prefix, with short timeouts;
# it fails open while Redis is away (config/cache.py). Without Redis there is one web process: its own memory.
CACHES = {"default": {"BACKEND": "config.cache.FailOpenRedisCache", "LOCATION": REDIS_URL,
                      "KEY_PREFIX": "gpumarket-cache",
                      "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1}}} if REDIS_URL else {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- The fleet ---------------------------------------------------------------------------------
FLEET = {
    "HEARTBEAT_TIMEOUT_SECONDS": env_float("FLEET_HEARTBEAT_TIMEOUT", 15.0, minimum=1.0),
    "METRICS_INTERVAL_SECONDS": env_float("FLEET_METRICS_INTERVAL", 1.0, minimum=0.05, maximum=60),
    "METRICS_FLUSH_SECONDS": env_float("FLEET_METRICS_FLUSH", 2.0, minimum=0.05, maximum=60),
    # GPU-minute aggregates a web process keeps while flushes fail (database away); past it the oldest
    # minutes are dropped. 200,000 is 50 minutes of 500 nodes x 8 GPUs, a few hundred bytes each.
    "METRICS_BUFFER_MAX_ROLLUPS": env_int("FLEET_METRICS_BUFFER_MAX_ROLLUPS", 200_000, minimum=1),
    # Each web process writes its metrics flushes through a writer process of its own (scheduler/gateway/
    # writer.py), off the interpreter its websockets run in; off: in a thread of the web process.
    "METRICS_WRITER_PROCESS": env_bool("FLEET_METRICS_WRITER_PROCESS", True),
    # A flush the writer has not answered after this long (a database that hangs) counts as failed.
    "METRICS_WRITE_TIMEOUT_SECONDS": env_float("FLEET_METRICS_WRITE_TIMEOUT", 60.0, minimum=1.0),
    "COMMAND_TIMEOUT_SECONDS": env_float("FLEET_COMMAND_TIMEOUT", 30.0, minimum=1.0),
    "OFFLINE_CHECK_SECONDS": env_float("FLEET_OFFLINE_CHECK", 5.0, minimum=0.5),
    # An offline node's leases end only after this much more silence (as lost at its last heartbeat, the silent
    # time refunded): a node back within it keeps them. Covers an outage of the platform's own parts (Redis, a
    # web process) that silences healthy nodes (docs/market.md "When a node falls silent").
    "OFFLINE_LEASE_GRACE_SECONDS": env_float("FLEET_OFFLINE_LEASE_GRACE", 120.0, minimum=0.0),
    # At least this share of the live fleet (2 nodes at least) silent at once is the platform's outage, not the
    # nodes': the check marks none of them offline until their silence outlasts the grace.
    "OFFLINE_MASS_SHARE": env_float("FLEET_OFFLINE_MASS_SHARE", 0.5, minimum=0.0, maximum=1.0),
    # Health thresholds that cordon a GPU (DESIGN.md §7).
    "MAX_TEMPERATURE_C": env_float("FLEET_MAX_TEMPERATURE_C", 90.0, minimum=30, maximum=150),
    "MAX_ECC_DBE": env_int("FLEET_MAX_ECC_DBE", 0, minimum=0),
    # XIDs that mean the GPU needs attention (NVIDIA XID catalogue: 48 DBE, 63/64 row remap, 74 NVLink,
    # 79 fallen off the bus, 92 high SBE rate, 94/95 contained/uncontained ECC).
    "CORDON_XIDS": env_int_list("FLEET_CORDON_XIDS", [48, 63, 64, 74, 79, 92, 94, 95]),
    # Power above this share of the model's TDP for this many samples in a row cordons the GPU.
    "POWER_CORDON_SHARE": env_float("FLEET_POWER_CORDON_SHARE", 1.1, minimum=1.0, maximum=3.0),
    "POWER_CORDON_SAMPLES": env_int("FLEET_POWER_CORDON_SAMPLES", 5, minimum=1, maximum=3600),
    # Per-socket limits on agent frames (token buckets: frames per second, and how many may come back to
    # back). Over the rate a frame gets an error and is dropped; more than AGENT_MAX_DROPPED drops within
    # AGENT_DROP_WINDOW_SECONDS close the socket (4400).
    "AGENT_METRICS_RATE": env_float("FLEET_AGENT_METRICS_RATE", 5.0, minimum=0.1, maximum=1e6),
    "AGENT_METRICS_BURST": env_int("FLEET_AGENT_METRICS_BURST", 10, minimum=1, maximum=10**6),
    "AGENT_EVENT_RATE": env_float("FLEET_AGENT_EVENT_RATE", 1.0, minimum=0.01, maximum=1e6),
    "AGENT_EVENT_BURST": env_int("FLEET_AGENT_EVENT_BURST", 20, minimum=1, maximum=10**6),
    # Containers' state changes from one agent (a few per lease; a node starting 56 slices at once sends ~170).
    "AGENT_WORKLOAD_RATE": env_float("FLEET_AGENT_WORKLOAD_RATE", 20.0, minimum=0.01, maximum=1e6),
    "AGENT_WORKLOAD_BURST": env_int("FLEET_AGENT_WORKLOAD_BURST", 400, minimum=1, maximum=10**6),
    # Containers' output from one agent (log chunks of up to 16 KiB, each container's flushed every 0.5 s).
    "AGENT_LOGS_RATE": env_float("FLEET_AGENT_LOGS_RATE", 50.0, minimum=0.01, maximum=1e6),
    "AGENT_LOGS_BURST": env_int("FLEET_AGENT_LOGS_BURST", 200, minimum=1, maximum=10**6),
    # Hellos on one socket: one per connection from a healthy agent, and the costliest frame (the whole inventory
    # upserted under the node's lock); a flood of them on a socket slowed every API request. (A loop of new
    # connections is another socket each time: limit connection rates at the reverse proxy, deploy/nginx.conf.)
    "AGENT_HELLO_RATE": env_float("FLEET_AGENT_HELLO_RATE", 0.2, minimum=0.001, maximum=1e6),
    "AGENT_HELLO_BURST": env_int("FLEET_AGENT_HELLO_BURST", 3, minimum=1, maximum=10**6),
    "AGENT_EVENT_DETAIL_MAX_BYTES": env_int("FLEET_AGENT_EVENT_DETAIL_MAX_BYTES", 4096, minimum=64,
                                            maximum=1 << 20),
    "AGENT_MAX_DROPPED": env_int("FLEET_AGENT_MAX_DROPPED", 30, minimum=1),
    "AGENT_DROP_WINDOW_SECONDS": env_float("FLEET_AGENT_DROP_WINDOW", 10.0, minimum=1.0, maximum=3600),
}
if FLEET["AGENT_METRICS_RATE"] * FLEET["METRICS_INTERVAL_SECONDS"] < 1.5:
    # Agents send one frame per interval: a limit at or under that rate would refuse healthy agents.
    from config.env import ImproperlyConfiguredEnv

    raise ImproperlyConfiguredEnv("FLEET_AGENT_METRICS_RATE", f"{FLEET['AGENT_METRICS_RATE']:g} frames/s is too "
                                  f"low for FLEET_METRICS_INTERVAL {FLEET['METRICS_INTERVAL_SECONDS']:g} s "
                                  f"(needs at least 1.5 frames per interval)")

# --- REST API ----------------------------------------------------------------------------------
# The reliability score (docs/operations.md "Reliability score"): the weight of each component and the penalty of
# each health event ("xid:<code>" overrides "xid"); what is left out takes scheduler.core.reliability's default.
RELIABILITY = {
    "WEIGHTS": {"uptime": 0.30, "provisioning": 0.15, "health": 0.25, "interruptions": 0.15, "buyer_reports": 0.15},
    "PENALTIES": {},
    "WINDOW_DAYS": env_int("RELIABILITY_WINDOW_DAYS", 30, minimum=1, maximum=365),
    "RECOMPUTE_SECONDS": env_float("RELIABILITY_RECOMPUTE_SECONDS", 300.0, minimum=10),
    # A node's events rescore it at most once per this many seconds (a burst of XIDs: once now, once at its end).
    "EVENT_RESCORE_SECONDS": env_float("RELIABILITY_EVENT_RESCORE_SECONDS", 30.0, minimum=1),
}

REST_FRAMEWORK = {
    # Writes are one JSON object everywhere (anything else is a 400 or a 415 in the one error shape).
    "DEFAULT_PARSER_CLASSES": ["marketplace.api.json_only.JSONObjectParser"],
    # Answers are JSON (no HTML browsable API: people read the schema at /api/docs/); a statement is CSV on request.
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "marketplace.api.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Signed in, an API key's scopes (docs/api.md), then JSON-only writes.
    "DEFAULT_PERMISSION_CLASSES": ["marketplace.api.scopes.KeyScopes", "marketplace.api.json_only.JsonOnlyWrites"],
    "DEFAULT_PAGINATION_CLASS": "marketplace.api.pagination.Pages",
    "DEFAULT_FILTER_BACKENDS": ["marketplace.api.filtering.QueryFilters"],
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "marketplace.api.schema.ApiSchema",
    "EXCEPTION_HANDLER": "marketplace.api.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.UserRateThrottle",
                                 "rest_framework.throttling.AnonRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": env_rate("API_THROTTLE_USER", "6000/min"),
                               "anon": env_rate("API_THROTTLE_ANON", "120/min")},
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "NUM_PROXIES": NUM_PROXIES,
}
# The schema is the contract (marketplace/api/schema.py, docs/api.md): request bodies apart from responses, so a
# generated client's request models hold only what may be sent.
SPECTACULAR_SETTINGS = {"TITLE": "GPU Market API", "VERSION": "1.0.0",
                        "DESCRIPTION": "Fleet, catalog and market API of GPU Market. Every error has one shape: "
                                       '`{"error": {"code", "message", "fields"?, "details"?}}` (docs/api.md).',
                        "SERVE_INCLUDE_SCHEMA": False, "COMPONENT_SPLIT_REQUEST": True,
                        "SCHEMA_PATH_PREFIX": r"/api/v1",  # operation ids like orders_create, tags like orders
                        "ENUM_NAME_OVERRIDES": {"NodeStatusEnum": "scheduler.models.fleet.Node.Status",
                                                "WorkloadKindEnum": "marketplace.models.workloads.KIND_CHOICES",
                                                "ModeEnum": "marketplace.models.market.Mode",
                                                "GroupModeEnum": "marketplace.models.operations.GROUP_MODES",
                                                "ReclaimNoticeStateEnum":
                                                    "marketplace.models.operations.ReclaimNotice.State",
                                                "AutoscaleActionKindEnum":
                                                    "marketplace.models.operations.AutoscaleAction.Kind",
                                                "TcoOptionEnum": "marketplace.api.tco.OPTION_NAMES",
                                                "BudgetCapEnum": "marketplace.models.billing.Project.BudgetCap"}}


# A browser form posted without its CSRF token: the console's page, or JSON under /api/ (marketplace/views/errors.py).
CSRF_FAILURE_VIEW = "marketplace.views.errors.csrf_failure"

# Webhook URLs must be public (marketplace/notifications.py, against SSRF); the demo's settings allow loopback.
WEBHOOKS_ALLOW_LOOPBACK = False

# --- Prometheus (docs/operations.md, Prometheus) ----------------------------------------------------------
# /metrics answers only `Authorization: Bearer <METRICS_TOKEN>`; unset, the endpoint is off (404). At least 16
# characters: it shows the whole fleet.
METRICS_TOKEN = env_str("METRICS_TOKEN")
if METRICS_TOKEN is not None and len(METRICS_TOKEN) < 16:
    raise ImproperlyConfiguredEnv("METRICS_TOKEN", "must be at least 16 characters (or unset to turn /metrics off)")

# --- Money -------------------------------------------------------------------------------------
PLATFORM_FEE_RATE = env_decimal("PLATFORM_FEE_RATE", "0.10", minimum=Decimal("0"), maximum=1)
STRIPE_SECRET_KEY = env_str("STRIPE_SECRET_KEY")
STRIPE_PUBLISHABLE_KEY = env_str("STRIPE_PUBLISHABLE_KEY")
STRIPE_WEBHOOK_SECRET = env_str("STRIPE_WEBHOOK_SECRET")
STRIPE_API_BASE = env_str("STRIPE_API_BASE")  # a local fake Stripe server in the demo and tests

# --- Provider payouts (docs/payments.md, Payouts) -----------------------------------------------------
# Earnings become payable this many days after they were earned (a reserved window's once the window is over).
PAYOUT_HOLD_DAYS = env_float("PAYOUT_HOLD_DAYS", 7.0, minimum=0, maximum=365)
PAYOUT_MINIMUM = env_decimal("PAYOUT_MINIMUM", "10.00", minimum=Decimal("0.01"), maximum=1000000)
# How approved payouts are paid: Stripe Connect transfers, or a simulated transfer (the demo: localstripe has no
# Connect). The beat sends approved payouts again whose transfer did not get through (Stripe unreachable).
PAYOUT_TRANSFERS = env_choice("PAYOUT_TRANSFERS", "stripe", ("stripe", "simulated"))
PAYOUT_RESEND_SECONDS = env_float("PAYOUT_RESEND_SECONDS", 300.0, minimum=10)

# --- The market (docs/market.md) ------------------------------------------------------------------
MARKET = {
    # Spot interruption notice (DESIGN §5); a notice shorter than this is compensated automatically.
    "SPOT_NOTICE_SECONDS": env_float("MARKET_SPOT_NOTICE_SECONDS", 120.0, minimum=0),
    # Notice given to spot leases preempted for a higher class's order (less than the above = a credit).
    "PREEMPT_NOTICE_SECONDS": env_float("MARKET_PREEMPT_NOTICE_SECONDS", 120.0, minimum=0),
    "SHORT_NOTICE_CREDIT_HOURS": env_decimal("MARKET_SHORT_NOTICE_CREDIT_HOURS", "1", minimum=Decimal("0")),
    # Price factors on base × share (DESIGN §5; scheduler.core.pricing.PriceRules is the one rule).
    "ON_DEMAND_FACTOR": env_decimal("MARKET_ON_DEMAND_FACTOR", "1.8", minimum=Decimal("0"), maximum=100),
    "RESERVED_FACTOR": env_decimal("MARKET_RESERVED_FACTOR", "0.85", minimum=Decimal("0"), maximum=100),
    "RESERVED_SHORT_NOTICE_FACTOR": env_decimal("MARKET_RESERVED_SHORT_NOTICE_FACTOR", "1.0",
                                                minimum=Decimal("0"), maximum=100),
    "SPOT_MIN_FACTOR": env_decimal("MARKET_SPOT_MIN_FACTOR", "0.5", minimum=Decimal("0"), maximum=100),
    "SPOT_MAX_FACTOR": env_decimal("MARKET_SPOT_MAX_FACTOR", "0.7", minimum=Decimal("0"), maximum=100),
    "RESALE_CAP": env_decimal("MARKET_RESALE_CAP", "0.9", minimum=Decimal("0"), maximum=1),  # of base: never above it
    "RESERVED_AHEAD_SECONDS": env_float("MARKET_RESERVED_AHEAD_SECONDS", 3600.0, minimum=0),
    # Cancelling a reserved window (docs/market.md, "Cancelling"): the whole price back until this long before its
    # start, or within the grace after booking; later, until the start, this share of it; after the start, never
    # (the holder lists the rest for resale).
    "RESERVATION_FREE_CANCEL_SECONDS": env_float("MARKET_RESERVATION_FREE_CANCEL_SECONDS", 86400.0, minimum=0),
    "RESERVATION_CANCEL_GRACE_SECONDS": env_float("MARKET_RESERVATION_CANCEL_GRACE_SECONDS", 600.0, minimum=0),
    "RESERVATION_LATE_CANCEL_REFUND": env_decimal("MARKET_RESERVATION_LATE_CANCEL_REFUND", "0.5",
                                                  minimum=Decimal("0"), maximum=1),
    "MAX_DURATION_SECONDS": env_int("MARKET_MAX_DURATION_SECONDS", 90 * 86400, minimum=60),
    "MIN_PREPAID_SECONDS": env_float("MARKET_MIN_PREPAID_SECONDS", 600.0, minimum=0),
    "BALANCE_WARN_SECONDS": env_float("MARKET_BALANCE_WARN_SECONDS", 900.0, minimum=0),
    "BALANCE_STOP_SECONDS": env_float("MARKET_BALANCE_STOP_SECONDS", 30.0, minimum=0),
    # Budgets (docs/payments.md, "Budgets"): a hard-capped project is told this long before its pay-as-you-go leases
    # reach the cap at their burn rate; a new order holds this long of each such lease against the budget.
    "BUDGET_NOTICE_SECONDS": env_float("MARKET_BUDGET_NOTICE_SECONDS", 900.0, minimum=0),
    # Auto top-up: an off-session charge that fails this many times in a row turns auto top-up off (with a notice).
    "AUTO_TOPUP_MAX_FAILURES": env_int("MARKET_AUTO_TOPUP_MAX_FAILURES", 3, minimum=1, maximum=20),
    "METER_SECONDS": env_float("MARKET_METER_SECONDS", 5.0, minimum=0.5),
    "QUEUE_SECONDS": env_float("MARKET_QUEUE_SECONDS", 5.0, minimum=0.5),
    "SPOT_PRICE_SECONDS": env_float("MARKET_SPOT_PRICE_SECONDS", 30.0, minimum=1),
    "LEASE_TICK_SECONDS": env_float("MARKET_LEASE_TICK_SECONDS", 2.0, minimum=0.5),
    "PLACE_RETRIES": env_int("MARKET_PLACE_RETRIES", 8, minimum=0, maximum=100),
    "QUEUE_BATCH": env_int("MARKET_QUEUE_BATCH", 100, minimum=1),
    "WEBHOOK_TIMEOUT_SECONDS": env_float("MARKET_WEBHOOK_TIMEOUT_SECONDS", 5.0, minimum=0.1, maximum=30),
    # How long a lease may take to be carved before its window counts (its holds cover it meanwhile).
    "PROVISION_ALLOWANCE_SECONDS": env_float("MARKET_PROVISION_ALLOWANCE_SECONDS", 300.0, minimum=0,
                                             maximum=86400),
    # Read paths (catalog, order preview) reuse one pool snapshot this long, refreshed in the background; claims
    # re-check under locks. A refresh costs about 0.1 s of CPU per 1,000 GPUs (bench/catalog_scale.py).
    "SNAPSHOT_TTL_SECONDS": env_float("MARKET_SNAPSHOT_TTL_SECONDS", 10.0, minimum=0, maximum=300),
    # The demand mix the engine weighs packing by (marketplace/claims/demand.py): the requests of the last
    # DEMAND_MIX_ORDERS orders created within DEMAND_MIX_DAYS (0 orders: the engine's prior alone), read again
    # at most every DEMAND_MIX_TTL_SECONDS.
    "DEMAND_MIX_ORDERS": env_int("MARKET_DEMAND_MIX_ORDERS", 2000, minimum=0, maximum=100_000),
    "DEMAND_MIX_DAYS": env_float("MARKET_DEMAND_MIX_DAYS", 14.0, minimum=0.01, maximum=365),
    "DEMAND_MIX_TTL_SECONDS": env_float("MARKET_DEMAND_MIX_TTL_SECONDS", 60.0, minimum=0, maximum=86400),
    # Workloads: how long a container gets between SIGTERM and the kill when its lease ends, and how much of
    # its output is kept on the lease (the console's log tail and download).
    "WORKLOAD_STOP_GRACE_SECONDS": env_float("MARKET_WORKLOAD_STOP_GRACE_SECONDS", 10.0, minimum=0, maximum=600),
    "WORKLOAD_LOG_TAIL_BYTES": env_int("MARKET_WORKLOAD_LOG_TAIL_BYTES", 64 * 1024, minimum=1024,
                                       maximum=16 * 1024 * 1024),
    # How often idle reclaim policies and autoscaling rules are evaluated on the minute rollups (docs/operations.md).
    "OPERATIONS_SECONDS": env_float("MARKET_OPERATIONS_SECONDS", 30.0, minimum=0.5),
    # How often the ledger is reconciled in production (balances against entries; admin + log on a miss).
    "LEDGER_CHECK_SECONDS": env_float("MARKET_LEDGER_CHECK_SECONDS", 3600.0, minimum=10),
    # Alerts judge whole minutes of metrics (GpuMetricRollup): once a minute is enough (docs/operations.md "Alerts").
    "ALERTS_SECONDS": env_float("MARKET_ALERTS_SECONDS", 60.0, minimum=1),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_log_level("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

CELERY_BEAT_SCHEDULE = {
    "fleet-offline": {"task": "fleet.mark_silent_nodes_offline", "schedule": FLEET["OFFLINE_CHECK_SECONDS"]},
    "fleet-expire-commands": {"task": "fleet.expire_commands", "schedule": 5.0},
    "fleet-reliability": {"task": "fleet.reliability", "schedule": RELIABILITY["RECOMPUTE_SECONDS"]},
    "market-meter": {"task": "market.meter", "schedule": MARKET["METER_SECONDS"]},
    "market-retry-queue": {"task": "market.retry_queue", "schedule": MARKET["QUEUE_SECONDS"]},
    "market-spot-prices": {"task": "market.spot_prices", "schedule": MARKET["SPOT_PRICE_SECONDS"]},
    "market-lease-tick": {"task": "market.lease_tick", "schedule": MARKET["LEASE_TICK_SECONDS"]},
    "market-reservations": {"task": "market.reservations_tick", "schedule": MARKET["LEASE_TICK_SECONDS"]},
    "market-reclaim": {"task": "market.reclaim", "schedule": MARKET["OPERATIONS_SECONDS"]},
    "market-autoscale": {"task": "market.autoscale", "schedule": MARKET["OPERATIONS_SECONDS"]},
    "money-ledger-check": {"task": "money.ledger_check", "schedule": MARKET["LEDGER_CHECK_SECONDS"]},
    "money-payouts-resend": {"task": "money.payouts_resend", "schedule": PAYOUT_RESEND_SECONDS},
    "market-alerts": {"task": "market.alerts_evaluate", "schedule": MARKET["ALERTS_SECONDS"]},
}
SPECTACULAR_SETTINGS.update({"SWAGGER_UI_DIST": "SIDECAR", "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
                             "REDOC_DIST": "SIDECAR"})
INSTALLED_APPS.append("drf_spectacular_sidecar")  # Swagger UI served from our own static files, no CDN
