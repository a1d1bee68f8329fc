from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks


class ConsoleConfig(AppConfig):
    name = "apps.console"
    label = "console"

    def ready(self) -> None:
        checks.register(secret_key_from_checkout_file, checks.Tags.security, deploy=True)
        checks.register(production_keys_and_tokens, checks.Tags.security, deploy=True)


def secret_key_from_checkout_file(**kwargs: Any) -> list[checks.CheckMessage]:
    """`check --deploy` flags a SECRET_KEY read from the local var/secret-key: production sets
    TXHUB_SECRET_KEY, and a deployment that forgot it must not pass by running from a checkout."""
    if getattr(settings, "SECRET_KEY_SOURCE", "environment") == "environment":
        return []
    return [
        checks.Warning(
            f"SECRET_KEY comes from {settings.SECRET_KEY_FILE}, the local development key.",
            hint="Set TXHUB_SECRET_KEY in production (see docs/operations.md).",
            id="txhub.W001",
        )
    ]


def production_keys_and_tokens(**kwargs: Any) -> list[checks.CheckMessage]:
    """`check --deploy` errors for what production must set (docs/operations.md): a metrics
    token (without one, /metrics answers only operators signed in to the console, never Prometheus:
    docs/decisions/0090) and a credentials key of its own (docs/decisions/0036)."""
    found: list[checks.CheckMessage] = []
    if not settings.DEBUG and not settings.TXHUB_METRICS_TOKEN:
        found.append(
            checks.Error(
                "Prometheus cannot scrape /metrics: TXHUB_METRICS_TOKEN is not set.",
                hint="Set TXHUB_METRICS_TOKEN; Prometheus sends it as a bearer token.",
                id="txhub.E001",
            )
        )
    source = getattr(settings, "CREDENTIALS_KEY_SOURCE", "environment")
    if source == "SECRET_KEY" or settings.TXHUB_CREDENTIALS_KEY == settings.SECRET_KEY:
        found.append(
            checks.Error(
                "RocketMQ secret keys are derived from SECRET_KEY.",
                hint="Set TXHUB_CREDENTIALS_KEY to a value of its own (docs/decisions/0036).",
                id="txhub.E002",
            )
        )
    elif source == "file":
        found.append(
            checks.Warning(
                f"TXHUB_CREDENTIALS_KEY comes from {settings.CREDENTIALS_KEY_FILE}, the local key.",
                hint="Set TXHUB_CREDENTIALS_KEY in production (see docs/operations.md).",
                id="txhub.W002",
            )
        )
    return found
