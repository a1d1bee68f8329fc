"""A minimal Django + Celery shop: what Django users do today to publish an event with an order.

Its own database (txhub_oncommit) on txhub's Postgres and its own Redis database (5) on txhub's
Redis; Celery's defaults otherwise (early acks, prefetch, Redis visibility timeout of an hour).
"""

import os

PG_PORT = os.environ.get("TXHUB_PG_PORT", "54329")
REDIS_PORT = os.environ.get("TXHUB_REDIS_PORT", "63799")

SECRET_KEY = "bench-oncommit-not-secret"  # noqa: S105 - a local benchmark, no users
USE_TZ = True
INSTALLED_APPS = ["shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "txhub_oncommit",
        "USER": "txhub",
        "HOST": "127.0.0.1",
        "PORT": PG_PORT,
    }
}
CELERY_BROKER_URL = f"redis://127.0.0.1:{REDIS_PORT}/5"
CELERY_TASK_IGNORE_RESULT = True
