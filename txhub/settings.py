"""txhub settings: one file, every deployment knob read from the environment.

With no environment set, everything points at the local services that `make run` starts
(Postgres on 127.0.0.1:54329, Redis on 127.0.0.1:63799), so manage.py, Celery and the tests agree.
"""

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

from txhub import connections

BASE_DIR = Path(__file__).resolve().parent.parent

# `make run-ha` writes var/ha/env while its cluster runs: manage.py here reaches it with no more
# environment (decision 0042). Set variables win; "" ignores it (`make run`, `make test` do).
HA_ENV_FILE = os.environ.get("TXHUB_HA_ENV_FILE", str(BASE_DIR / "var" / "ha" / "env"))
if HA_ENV_FILE:
    connections.read_env_file(Path(HA_ENV_FILE))


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def env_bool(name: str, default: bool) -> bool:
    return os.environ.get(name, str(default)).lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("TXHUB_DEBUG", False)

# --- Secret key -------------------------------------------------------------------------------
# Production sets TXHUB_SECRET_KEY. scripts/services.sh writes a random one to var/secret-key
# (0600) for every process of a local checkout; `check --deploy` flags a key read from there
# (txhub.W001). With neither, and TXHUB_DEBUG off, txhub refuses to start (forged sessions).
PUBLIC_DEVELOPMENT_SECRET_KEY = "txhub-local-development-only-not-a-secret"  # noqa: S105
SECRET_KEY_FILE = Path(env_str("TXHUB_SECRET_KEY_FILE", str(BASE_DIR / "var" / "secret-key")))
SECRET_KEY_SOURCE = "environment"  # noqa: S105 - where the key came from, not a key
SECRET_KEY = env_str("TXHUB_SECRET_KEY", "")
if not SECRET_KEY and SECRET_KEY_FILE.is_file():
    SECRET_KEY, SECRET_KEY_SOURCE = SECRET_KEY_FILE.read_text().strip(), "file"
if not SECRET_KEY and DEBUG:
    SECRET_KEY, SECRET_KEY_SOURCE = PUBLIC_DEVELOPMENT_SECRET_KEY, "public default"
if not DEBUG and SECRET_KEY in {"", PUBLIC_DEVELOPMENT_SECRET_KEY}:
    raise ImproperlyConfigured(
        "TXHUB_SECRET_KEY is not set (or is the public development default) and TXHUB_DEBUG is "
        "off: refusing to start. Set TXHUB_SECRET_KEY to a long random value (e.g. `python -c "
        "'import secrets; print(secrets.token_urlsafe(50))'`), or run scripts/services.sh up "
        f"for a local install (it writes {SECRET_KEY_FILE})."
    )

ALLOWED_HOSTS = env_list("TXHUB_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")

# --- Behind a TLS proxy (docs/operations.md); the defaults suit the local plain-HTTP install ----
# Cookies only over HTTPS; HSTS; redirect plain HTTP to HTTPS except the probes and the scrape
# endpoint (a load balancer or Prometheus inside the network speaks plain HTTP to them).
SECURE_COOKIES = env_bool("TXHUB_SECURE_COOKIES", False)
SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
SECURE_HSTS_SECONDS = env_int("TXHUB_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("TXHUB_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("TXHUB_HSTS_PRELOAD", False)
SECURE_SSL_REDIRECT = env_bool("TXHUB_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
# "HTTP_X_FORWARDED_PROTO,https": trust the proxy's header saying the request came over HTTPS.
# Only behind a proxy that always sets (or strips) that header; otherwise a client could forge it.
_proxy_header = env_list("TXHUB_SECURE_PROXY_SSL_HEADER", "")
if _proxy_header:
    if len(_proxy_header) != 2:
        raise ImproperlyConfigured(
            "TXHUB_SECURE_PROXY_SSL_HEADER must be '<header>,<value>', "
            "e.g. HTTP_X_FORWARDED_PROTO,https"
        )
    SECURE_PROXY_SSL_HEADER = (_proxy_header[0], _proxy_header[1])
# The console's POSTs pass Django's origin check behind a proxy: e.g. "https://txhub.example.com".
CSRF_TRUSTED_ORIGINS = env_list("TXHUB_CSRF_TRUSTED_ORIGINS", "")
CSRF_FAILURE_VIEW = "apps.broker.api.errors.csrf_failure"  # by door, as a 403 (decision 0114)
# Secrets shown once (a new token, a signing secret) live in the session's messages, never a cookie.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

INSTALLED_APPS = [
    "apps.broker.admin_config.TxhubAdminConfig",  # Django's admin, our site (decision 0103)
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",  # login throttling for the console and the admin (docs/decisions/0012)
    "apps.broker",
    "apps.console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "txhub.static_files.StaticFilesMiddleware",  # WhiteNoise (docs/decisions/0060)
    "apps.console.unstorable.UnstorableQueryMiddleware",  # 400 for a NUL in a page's query
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "apps.console.content_security.ContentSecurityPolicyMiddleware",  # decision 0092
    "apps.console.unavailable.DatabaseUnavailableMiddleware",  # a banner, not a 500, if no DB
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks: a lockout's 429
]

ROOT_URLCONF = "txhub.urls"
WSGI_APPLICATION = "txhub.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "apps.console.roles.navigation",
            ],
        },
    },
]

TXHUB_PG_PORT = env_int("TXHUB_PG_PORT", 54329)
TXHUB_REDIS_PORT = env_int("TXHUB_REDIS_PORT", 63799)

# psycopg's pool, bounded (docs/decisions/0024, superseding 0003): under ASGI a request's sync code
# runs on whichever thread of the web process's pool is free, so per-thread persistent connections
# would be one per thread ever used. Every process (web, Celery, manage.py) takes a connection from
# its pool for one request or task and gives it back at the end (CONN_MAX_AGE=0, as Django asks
# with a pool). A web process holds at most TXHUB_DB_POOL_SIZE connections plus its one LISTEN
# connection, whatever the number of clients waiting in long polls. Checked on checkout
# (CONN_HEALTH_CHECKS): a connection that died with a Postgres restart is replaced, not used.
# TXHUB_DB_POOL=0 goes back to per-thread persistent connections (gthread only).
DB_POOL = env_bool("TXHUB_DB_POOL", True)
DATABASES = {
    "default": connections.parse_database_url(
        env_str("DATABASE_URL", f"postgres://txhub@127.0.0.1:{TXHUB_PG_PORT}/txhub"),
        conn_max_age=0 if DB_POOL else env_int("TXHUB_CONN_MAX_AGE", 300),
        conn_health_checks=env_bool("TXHUB_CONN_HEALTH_CHECKS", True),
    )
}
# Django's PostgreSQL backend whose pool drops all dead idle connections at once after a restart.
DATABASES["default"]["ENGINE"] = "txhub.postgres"
# A receive waits for its WAL flush only on a replicated cluster (a multi-host URL), where a
# primary that lost its lock must not answer one (decisions 0025, 0050).
_REPLICATED = "," in str(DATABASES["default"]["HOST"])
TXHUB_RECEIVE_SYNCHRONOUS_COMMIT = env_bool("TXHUB_RECEIVE_SYNCHRONOUS_COMMIT", _REPLICATED)
# Parameters bound by the server, not quoted in Python: less CPU per query on the hot paths.
DATABASES["default"].setdefault("OPTIONS", {})["server_side_binding"] = True
# Statements a connection has run this many times are prepared on it (psycopg's auto-prepare;
# docs/decisions/0027). "" behind a proxy that cannot keep prepared statements (old PgBouncer).
_prepare_threshold = env_str("TXHUB_DB_PREPARE_THRESHOLD", "5")
DATABASES["default"]["OPTIONS"]["prepare_threshold"] = (
    int(_prepare_threshold) if _prepare_threshold else None
)
TXHUB_DB_POOL_SIZE = env_int("TXHUB_DB_POOL_SIZE", 10)
if DB_POOL:
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": min(env_int("TXHUB_DB_POOL_MIN", 1), TXHUB_DB_POOL_SIZE),
        "max_size": TXHUB_DB_POOL_SIZE,
        # A request waits this long for a free connection before it answers 503.
        "timeout": env_float("TXHUB_DB_POOL_TIMEOUT", 10),
        # Failed reconnects back off 1, 2, 4 ... s; give up after this, and start again at once
        # while requests wait: a Postgres that is back is used at once (decisions 0024, 0042).
        "reconnect_timeout": env_float("TXHUB_DB_POOL_RECONNECT_TIMEOUT", 2),
        "reconnect_failed": connections.reconnect_while_waited_for,
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = os.environ.get("TXHUB_STATIC_ROOT") or None  # collectstatic target, if used
WHITENOISE_USE_FINDERS = True  # serve app static files (admin, swagger UI) without collectstatic

# --- Login throttling (docs/decisions/0012) -----------------------------------------------------
# django-axes counts failed console and admin logins in Postgres, shared by every web process:
# after TXHUB_LOGIN_FAILURE_LIMIT failures for one username from one address, that pair is
# refused (429) for TXHUB_LOGIN_COOLOFF_SECONDS. `manage.py axes_reset` lifts every lock.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out login before the check
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("TXHUB_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("TXHUB_LOGIN_COOLOFF_SECONDS", 900))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_DISABLE_ACCESS_LOG = True  # failures are kept (and expire); successful logins are not logged
AXES_ENABLED = env_bool("TXHUB_LOGIN_THROTTLE", True)

LOGIN_URL = "/console/login/"
LOGIN_REDIRECT_URL = "/console/"

# A base64 body of 4 MiB is ~5.6 MB of JSON; the API's own parser enforces the real limits.
DATA_UPLOAD_MAX_MEMORY_SIZE = 8 * 1024 * 1024

# --- Cache and API rate limits (docs/decisions/0011) --------------------------------------------
# One Redis cache shared by every web process (db 3: Celery uses 0; the tests 1, 2, 4 and up). Short
# socket timeouts: when Redis is away the throttle fails open after at most ~0.25 s, not 30 s.
TXHUB_CACHE_URL = env_str("TXHUB_CACHE_URL", f"redis://127.0.0.1:{TXHUB_REDIS_PORT}/3")
# Redis behind Sentinels ("host:port,..."; decision 0043): Celery and the cache ask them for it.
TXHUB_REDIS_SENTINELS = env_list("TXHUB_REDIS_SENTINELS", "")
TXHUB_REDIS_SENTINEL_MASTER = env_str("TXHUB_REDIS_SENTINEL_MASTER", "txhub")
CACHES: dict[str, dict[str, Any]] = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": TXHUB_CACHE_URL,
        "KEY_PREFIX": "txhub",
        "OPTIONS": {
            "socket_connect_timeout": env_float("TXHUB_CACHE_TIMEOUT", 0.25),
            "socket_timeout": env_float("TXHUB_CACHE_TIMEOUT", 0.25),
        },
    }
}
TXHUB_THROTTLE_CACHE = "default"
# Tokens, groups, topics and bindings kept per web process, checked against an epoch in that
# cache on every request (docs/decisions/0026); this long at most whatever the epoch says. 0: off.
TXHUB_CONFIG_CACHE_SECONDS = env_float("TXHUB_CONFIG_CACHE_SECONDS", 10.0)
# Failed authentications (docs/decisions/0038), per web process, in memory: bad token hashes
# remembered (how many, how long), and failures per client address per minute before its
# requests with unknown tokens are answered 429 without any lookup (0: no such limit).
TXHUB_BAD_TOKEN_MEMORY = env_int("TXHUB_BAD_TOKEN_MEMORY", 10000)
TXHUB_BAD_TOKEN_SECONDS = env_float("TXHUB_BAD_TOKEN_SECONDS", 300)
TXHUB_AUTH_FAILURES_PER_MINUTE = env_int("TXHUB_AUTH_FAILURES_PER_MINUTE", 60)
# Per API token, DRF's syntax ("2000/s", "100/min"); "0" or empty turns rate limiting off.
TXHUB_THROTTLE_RATE = env_str("TXHUB_THROTTLE_RATE", "2000/s").strip()
if TXHUB_THROTTLE_RATE in {"", "0"} or TXHUB_THROTTLE_RATE.startswith("0/"):
    TXHUB_THROTTLE_RATE = ""
else:
    _num, _, _period = TXHUB_THROTTLE_RATE.partition("/")
    if not (_num.isdecimal() and _period[:1] in {"s", "m", "h", "d"}):
        raise ImproperlyConfigured(
            f"TXHUB_THROTTLE_RATE={TXHUB_THROTTLE_RATE!r}: expected e.g. 2000/s, 100/min, or 0"
        )
_THROTTLE_CLASSES = ["apps.broker.api.throttling.TokenRateThrottle"] if TXHUB_THROTTLE_RATE else []

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["apps.broker.api.auth.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": _THROTTLE_CLASSES,
    "DEFAULT_PARSER_CLASSES": ["apps.broker.api.parsers.LimitedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "apps.broker.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "apps.broker.api.schema.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "txhub API",
    "DESCRIPTION": "Transactional messaging (RocketMQ half messages) over HTTP. "
    "Contract: CONTRACT.md v1.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",  # served locally: the docs page works offline
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "OAS_VERSION": "3.1.0",  # JSON Schema 2020-12: propertyNames (decision 0045)
}

# Celery: Redis carries only triggers; Postgres is the source of truth.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", f"redis://127.0.0.1:{TXHUB_REDIS_PORT}/0")
# Redis, without the restore-on-close that kills a worker when Redis goes away (see the module).
CELERY_BROKER_TRANSPORT = "txhub.broker_transport:Transport"
if TXHUB_REDIS_SENTINELS:
    _SENTINELS = (TXHUB_REDIS_SENTINELS, TXHUB_REDIS_SENTINEL_MASTER)
    CACHES["default"]["OPTIONS"] |= connections.cache_through_sentinels(*_SENTINELS)
    CELERY_BROKER_URL, CELERY_BROKER_TRANSPORT, CELERY_BROKER_TRANSPORT_OPTIONS = (
        connections.celery_through_sentinels(*_SENTINELS)
    )
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Producers' check URLs are called from a worker of their own (scripts/run.sh: `-Q callbacks`):
# a slow or hostile producer can fill that queue, never the default one the scans run on.
CELERY_TASK_ROUTES = {"apps.broker.tasks.checkback_run": {"queue": "callbacks"}}
CELERY_BEAT_SCHEDULE = {
    "expire-deliveries": {
        "task": "apps.broker.tasks.deliveries_expire_scan",
        "schedule": timedelta(seconds=env_int("TXHUB_EXPIRE_SCAN_SECONDS", 5)),
    },
    "checkback-scan": {
        "task": "apps.broker.tasks.checkback_scan",
        "schedule": timedelta(seconds=env_float("TXHUB_SCAN_SECONDS", 1.0)),
        "options": {"expires": 5},  # a scan that waited too long is replaced by the next one
    },
    "delayed-delivery-scan": {
        "task": "apps.broker.tasks.delayed_delivery_scan",
        "schedule": timedelta(seconds=env_float("TXHUB_SCAN_SECONDS", 1.0)),
        "options": {"expires": 5},
    },
    "retention": {
        "task": "apps.broker.tasks.retention_sweep",
        "schedule": timedelta(minutes=env_int("TXHUB_RETENTION_SWEEP_MINUTES", 10)),
    },
    "storage-measure": {
        "task": "apps.broker.tasks.storage_measure",
        "schedule": timedelta(seconds=env_float("TXHUB_STORAGE_MEASURE_SECONDS", 10)),
        "options": {"expires": 30},
    },
    "reconcile-nightly": {
        "task": "apps.broker.tasks.reconcile_nightly",
        # "minute hour day-of-month month day-of-week", in TIME_ZONE; default 02:30 every day.
        "schedule": crontab(*env_str("TXHUB_RECONCILE_CRON", "30 2 * * *").split()),
    },
}

# txhub behaviour (CONTRACT section 3 and 4).
TXHUB_MAX_BODY_BYTES = 4 * 1024 * 1024
# A batch (messages:batch, transactions:batch) carries at most this much body in all.
TXHUB_MAX_BATCH_BYTES = env_int("TXHUB_MAX_BATCH_BYTES", 4 * 1024 * 1024)
TXHUB_MAX_PROPERTIES = 128
TXHUB_MAX_META_BYTES = 16 * 1024
# Long polling (docs/decisions/0024): woken by NOTIFY, checked every FALLBACK s with one query for
# what none announced; under WSGI (the Django test client) a wait polls every INTERVAL s instead.
TXHUB_LONG_POLL_INTERVAL = env_float("TXHUB_LONG_POLL_INTERVAL", 0.1)
TXHUB_LONG_POLL_FALLBACK = env_float("TXHUB_LONG_POLL_FALLBACK", 1.0)
# Threads per ASGI web process that run Django's sync code (views, middleware, the ORM), one
# request at a time each; a request only gets one once its whole body has arrived.
TXHUB_WEB_THREADS = env_int("TXHUB_WEB_THREADS", 16)
# ... and receives, in threads of their own: consumers arriving all at once queue among themselves.
TXHUB_WEB_RECEIVE_THREADS = env_int("TXHUB_WEB_RECEIVE_THREADS", 4)
# ... and the hot calls the lean door answers (prepare, commit, rollback, send, ack, the batches),
# in a small pool of their own (docs/decisions/0031): each holds the GIL only briefly between two
# waits on Postgres, so a few threads per process keep two cores busy; 16 took turns instead.
TXHUB_WEB_HOT_THREADS = env_int("TXHUB_WEB_HOT_THREADS", 4)
# Slow and greedy clients (docs/decisions/0033), per web process: connections before a JSON 503;
# seconds a request may take to arrive whole before it is closed; bytes of its head before 431.
TXHUB_WEB_MAX_CONNECTIONS = env_int("TXHUB_WEB_MAX_CONNECTIONS", 2048)
TXHUB_WEB_REQUEST_READ_SECONDS = env_float("TXHUB_WEB_REQUEST_READ_SECONDS", 10.0)
TXHUB_WEB_MAX_HEADER_BYTES = env_int("TXHUB_WEB_MAX_HEADER_BYTES", 64 * 1024)
# Per token (docs/decisions/0084): waiting receives (REST, gRPC) and Telemetry streams held at once
# in one process, past which 429 / TOO_MANY_REQUESTS; and live gRPC client ids in all.
TXHUB_MAX_WAITS_PER_TOKEN = env_int("TXHUB_MAX_WAITS_PER_TOKEN", 64)
TXHUB_GRPC_MAX_STREAMS_PER_TOKEN = env_int("TXHUB_GRPC_MAX_STREAMS_PER_TOKEN", 64)
TXHUB_GRPC_MAX_CLIENTS_PER_TOKEN = env_int("TXHUB_GRPC_MAX_CLIENTS_PER_TOKEN", 256)
# The hot calls (prepare, commit, rollback, send, receive, ack, their batches) answered by the same
# views without Django's request cycle (apps/broker/api/lean.py, decision 0027); 0: Django does.
TXHUB_LEAN_DOOR = env_bool("TXHUB_LEAN_DOOR", True)

# Check-back (CONTRACT section 4), in seconds; RocketMQ's names in the comments.
TXHUB_TRANSACTION_TIMEOUT = env_float("TXHUB_TRANSACTION_TIMEOUT", 6)  # transactionTimeOut
TXHUB_CHECK_INTERVAL = env_float("TXHUB_CHECK_INTERVAL", 30)  # transactionCheckInterval
TXHUB_CHECK_MAX = env_int("TXHUB_CHECK_MAX", 15)  # transactionCheckMax
# Bounds a check call, lookup to last byte, and a check URL's lookup at registration (0083, 0087).
TXHUB_CHECK_HTTP_TIMEOUT = env_float("TXHUB_CHECK_HTTP_TIMEOUT", 3)
# Lookups left behind at that deadline one process may hold; past it, one fails at once (0087).
TXHUB_CHECK_MAX_ABANDONED_LOOKUPS = env_int("TXHUB_CHECK_MAX_ABANDONED_LOOKUPS", 16)
# A claimed check's task must leave the callbacks queue within this, or is claimed again (0049).
TXHUB_CHECK_DISPATCH_LEASE = env_float("TXHUB_CHECK_DISPATCH_LEASE", 10)
TXHUB_MAX_PENDING_AGE = env_float("TXHUB_MAX_PENDING_AGE", 72 * 3600)  # fileReservedTime
TXHUB_MAX_DELAY = env_float("TXHUB_MAX_DELAY", 3 * 24 * 3600)  # timerMaxDelaySec
# Unreachable callbacks back off from 1 s, doubling, up to this; they do not use the budget.
TXHUB_CHECK_MAX_BACKOFF = env_float("TXHUB_CHECK_MAX_BACKOFF", 300)
# Check calls run on their own Celery queue ("callbacks"), in a worker of this many processes
# (scripts/run.sh); scans never wait behind them (docs/decisions/0009).
TXHUB_CALLBACK_CONCURRENCY = env_int("TXHUB_CALLBACK_CONCURRENCY", 8)
# At most this many checks of one producer group in flight: kept below the callback concurrency,
# so a slow group holds at most this many of its slots and the others' checks still run.
TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP = env_int("TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP", 2)
# Plain http:// check URLs are refused unless this is on (`make run` and `make test` turn it on).
TXHUB_ALLOW_HTTP_CALLBACKS = env_bool("TXHUB_ALLOW_HTTP_CALLBACKS", False)
TXHUB_CHECK_BATCH = env_int("TXHUB_CHECK_BATCH", 500)
TXHUB_DELIVERY_BATCH = env_int("TXHUB_DELIVERY_BATCH", 500)
# How long one delivery scan keeps waking for due messages: about the beat period, so lateness
# is processing time rather than up to a whole period.
TXHUB_SCAN_SECONDS = env_float("TXHUB_SCAN_SECONDS", 1.0)
TXHUB_DELIVERY_SCAN_SPAN = env_float("TXHUB_DELIVERY_SCAN_SPAN", 0.95 * TXHUB_SCAN_SECONDS)
# Networks a check URL may resolve to although private; loopback is allowed in the development
# defaults. Set it to "" in production to refuse loopback too.
TXHUB_CALLBACK_ALLOWED_HOSTS = env_list("TXHUB_CALLBACK_ALLOWED_HOSTS", "127.0.0.0/8,::1/128")
# A rotated-out signing secret keeps signing (beside the new one) this long.
TXHUB_SECRET_ROTATION_GRACE = env_float("TXHUB_SECRET_ROTATION_GRACE", 24 * 3600)
# A retry with the same Idempotency-Key within this many seconds answers the first answer.
TXHUB_IDEMPOTENCY_TTL = env_float("TXHUB_IDEMPOTENCY_TTL", 24 * 3600)
# What is older than this and finished is deleted (docs/decisions/0080 says what is finished).
TXHUB_RETENTION = env_float("TXHUB_RETENTION", 72 * 3600)
TXHUB_DLQ_RETENTION = env_float("TXHUB_DLQ_RETENTION", 72 * 3600)  # from its dead-lettering
# A producer group's storage quota in bytes (0: none); sends and prepares over it: decision 0085.
TXHUB_PRODUCER_GROUP_STORAGE_QUOTA = env_int("TXHUB_PRODUCER_GROUP_STORAGE_QUOTA", 10 * 1024**3)
if TXHUB_PRODUCER_GROUP_STORAGE_QUOTA < 0:
    raise ImproperlyConfigured("TXHUB_PRODUCER_GROUP_STORAGE_QUOTA must be 0 (none) or bytes")
# The nightly reconciliation (spark_jobs/reconcile.py), launched with spark-submit.
TXHUB_SPARK_MASTER = env_str("TXHUB_SPARK_MASTER", "local[2]")
TXHUB_SPARK_DRIVER_MEMORY = env_str("TXHUB_SPARK_DRIVER_MEMORY", "2g")
_SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
TXHUB_SPARK_SUBMIT = env_str("TXHUB_SPARK_SUBMIT", _SPARK_SUBMIT)
TXHUB_JDBC_JAR = env_str("TXHUB_JDBC_JAR", "/usr/share/java/postgresql.jar")
TXHUB_RECONCILE_TIMEOUT = env_float("TXHUB_RECONCILE_TIMEOUT", 3 * 3600)
TXHUB_RECONCILE_OUTPUT = Path(env_str("TXHUB_RECONCILE_OUTPUT", f"{BASE_DIR}/var/reconciliation"))
# /metrics answers "Authorization: Bearer <this>" and console operators (decision 0090).
TXHUB_METRICS_TOKEN = env_str("TXHUB_METRICS_TOKEN", "")
# Failpoints (docs/decisions/0015) kill and stall processes on purpose: armed only in a debug run
# or when TXHUB_ALLOW_FAILPOINTS says so (the chaos suite), never by a stray variable.
if (
    env_str("TXHUB_FAILPOINTS", "").strip()
    and not DEBUG
    and not env_bool("TXHUB_ALLOW_FAILPOINTS", False)
):
    raise ImproperlyConfigured(
        "TXHUB_FAILPOINTS is set but TXHUB_DEBUG is off: refusing to start. Failpoints crash "
        "processes on purpose; set TXHUB_ALLOW_FAILPOINTS=1 as well to arm them on purpose."
    )
# /metrics reads its Postgres gauges at most once per this many seconds per web process.
TXHUB_METRICS_CACHE_SECONDS = env_float("TXHUB_METRICS_CACHE_SECONDS", 5)

# The RocketMQ 5 gRPC door (apps/broker/grpc, `manage.py grpcserver`).
TXHUB_GRPC_PORT = env_int("TXHUB_GRPC_PORT", 8081)
TXHUB_GRPC_HOST = env_str("TXHUB_GRPC_HOST", "127.0.0.1")
# Both set: TLS with this certificate chain and key (PEM files); otherwise plaintext.
TXHUB_GRPC_TLS_CERT = env_str("TXHUB_GRPC_TLS_CERT", "")
TXHUB_GRPC_TLS_KEY = env_str("TXHUB_GRPC_TLS_KEY", "")
# The server key RocketMQ secret keys are derived from (docs/decisions/0022, 0036): its own, not
# SECRET_KEY (rotating Django's sessions key must not change every client's secret). Production
# sets TXHUB_CREDENTIALS_KEY; the local set-up writes var/credentials-key (flagged by `check
# --deploy`); with neither, a debug run falls back to SECRET_KEY and a production run refuses.
_KEY_FILE = str(BASE_DIR / "var" / "credentials-key")
CREDENTIALS_KEY_FILE = Path(env_str("TXHUB_CREDENTIALS_KEY_FILE", _KEY_FILE))
CREDENTIALS_KEY_SOURCE = "environment"  # noqa: S105 - where the key came from, not a key
TXHUB_CREDENTIALS_KEY = env_str("TXHUB_CREDENTIALS_KEY", "")
if not TXHUB_CREDENTIALS_KEY and CREDENTIALS_KEY_FILE.is_file():
    TXHUB_CREDENTIALS_KEY = CREDENTIALS_KEY_FILE.read_text().strip()
    CREDENTIALS_KEY_SOURCE = "file"  # noqa: S105
if not TXHUB_CREDENTIALS_KEY and DEBUG:
    TXHUB_CREDENTIALS_KEY, CREDENTIALS_KEY_SOURCE = SECRET_KEY, "SECRET_KEY"
if not TXHUB_CREDENTIALS_KEY:
    raise ImproperlyConfigured(
        "TXHUB_CREDENTIALS_KEY is not set and TXHUB_DEBUG is off: refusing to start. Set it to a "
        "long random value of its own (to keep the RocketMQ secret keys tokens already have, set "
        "it to the SECRET_KEY they were derived from; docs/operations.md, Production), or run "
        f"scripts/services.sh up for a local install (it writes {CREDENTIALS_KEY_FILE})."
    )
# Announced to clients on Telemetry; a client's long poll is clamped to this range (seconds).
TXHUB_GRPC_LONG_POLL_MIN = env_float("TXHUB_GRPC_LONG_POLL_MIN", 5)
TXHUB_GRPC_LONG_POLL_MAX = env_float("TXHUB_GRPC_LONG_POLL_MAX", 20)
# A client not seen (heartbeat, any call) for this long is no longer listed as connected.
TXHUB_GRPC_CLIENT_TTL = env_float("TXHUB_GRPC_CLIENT_TTL", 60)
# A signed call's x-mq-date-time may be this far from the server's clock, either way (as
# RocketMQ's proxy checks it); 0 turns the check off (docs/decisions/0035).
TXHUB_GRPC_SIGNATURE_MAX_SKEW_SECONDS = env_float("TXHUB_GRPC_SIGNATURE_MAX_SKEW_SECONDS", 900)
# Commands waiting to be written to one Telemetry stream (a check carries its message's body):
# a client that lets more pile up is disconnected (docs/decisions/0034).
TXHUB_GRPC_STREAM_OUTBOX = env_int("TXHUB_GRPC_STREAM_OUTBOX", 16)
# A client not seen for this long is forgotten by the retention sweep (its row deleted).
TXHUB_GRPC_CLIENT_FORGET_SECONDS = env_float("TXHUB_GRPC_CLIENT_FORGET_SECONDS", 86400)
# The gRPC server's own bounds, per process (grpcio's options; docs/decisions/0037): RPCs at once
# (more: RESOURCE_EXHAUSTED), HTTP/2 streams per connection, a connection with no RPC for this
# long is closed, and every connection is closed after this age (clients reconnect), its open
# RPCs given the grace to end.
TXHUB_GRPC_MAX_CONCURRENT_RPCS = env_int("TXHUB_GRPC_MAX_CONCURRENT_RPCS", 2000)
TXHUB_GRPC_MAX_STREAMS_PER_CONNECTION = env_int("TXHUB_GRPC_MAX_STREAMS_PER_CONNECTION", 128)
TXHUB_GRPC_MAX_CONNECTION_IDLE_SECONDS = env_int("TXHUB_GRPC_MAX_CONNECTION_IDLE_SECONDS", 1800)
TXHUB_GRPC_MAX_CONNECTION_AGE_SECONDS = env_int("TXHUB_GRPC_MAX_CONNECTION_AGE_SECONDS", 86400)
TXHUB_GRPC_MAX_CONNECTION_AGE_GRACE_SECONDS = env_int(
    "TXHUB_GRPC_MAX_CONNECTION_AGE_GRACE_SECONDS", 60
)
# A consumer's retry backoff, announced on Telemetry (seconds before the nth redelivery, the last
# repeated): PushConsumers nack a failed message with it. RocketMQ's delay levels from 10 s on.
_BACKOFF = "10,30,60,120,180,240,300,360,420,480,540,600,1200,1800,3600"
TXHUB_GRPC_CONSUMER_BACKOFF = [int(s) for s in env_list("TXHUB_GRPC_CONSUMER_BACKOFF", _BACKOFF)]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("TXHUB_LOG_LEVEL", "INFO")},
}
