from django.apps import AppConfig


class BrokerConfig(AppConfig):
    name = "apps.broker"
    label = "broker"
    verbose_name = "Broker"
