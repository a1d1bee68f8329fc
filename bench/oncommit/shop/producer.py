"""The producer side: N threads, each an order saved and its event published on commit."""

import sys
import threading
import time

import django

django.setup()

import celery_app  # noqa: E402, F401 - .delay() publishes through this app's Redis
from django.db import connection, transaction  # noqa: E402

from shop.models import Order  # noqa: E402
from shop.tasks import order_created  # noqa: E402


def produce(until: float) -> None:
    while time.monotonic() < until:
        with transaction.atomic():
            order = Order.objects.create(body="bench message body")
            # What Django's docs recommend: publish only once the order is committed. A process
            # that dies after COMMIT and before this runs loses the event.
            transaction.on_commit(lambda order_id=order.pk: order_created.delay(order_id))
    connection.close()


if __name__ == "__main__":
    threads, seconds = int(sys.argv[1]), float(sys.argv[2])
    until = time.monotonic() + seconds
    workers = [threading.Thread(target=produce, args=(until,)) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
