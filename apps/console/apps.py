from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks


class ConsoleConfig(AppConfig):
    name = "apps.console"
    label = "console"

    def ready(self) -> None:
        checks.register(secret_key_from_checkout_file, checks.Tags.security, deploy=True)


def secret_key_from_checkout_file(**kwargs: Any) -> list[checks.CheckMessage]:
    """`check --deploy` flags a SECRET_KEY read from the local var/secret-key: production sets
    TXHUB_SECRET_KEY, and a deployment that forgot it must not pass by running from a checkout."""
    if getattr(settings, "SECRET_KEY_SOURCE", "environment") == "environment":
        return []
    return [
        checks.Warning(
            f"SECRET_KEY comes from {settings.SECRET_KEY_FILE}, the local development key.",
            hint="Set TXHUB_SECRET_KEY in production (see README, Production).",
            id="txhub.W001",
        )
    ]
