from celery import shared_task

from shop.models import Published


@shared_task
def order_created(order_id: int) -> None:
    """The consumer of the event (idempotent, as a careful user writes it)."""
    Published.objects.get_or_create(order_id=order_id)
