"""Celery tasks: thin, idempotent, no arguments but ids; each calls one service."""

from celery import shared_task

from apps.broker.services import consuming


@shared_task(acks_late=True)
def deliveries_expire_scan() -> int:
    """Dead-letters exhausted in-flight messages even where no consumer is receiving."""
    return consuming.deliveries_expire()
