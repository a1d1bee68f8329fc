from django.apps import AppConfig


class BrokerConfig(AppConfig):
    name = "apps.broker"
    label = "broker"
    verbose_name = "Broker"

    def ready(self) -> None:
        from apps.broker import config_cache
        from apps.broker.api import schema  # noqa: F401 - registers the OpenAPI auth extension

        config_cache.watch_models()
