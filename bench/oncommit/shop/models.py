from django.db import models


class Order(models.Model):
    created_at = models.DateTimeField(auto_now_add=True)
    body = models.TextField()

    def __str__(self) -> str:
        return f"order {self.pk}"


class Published(models.Model):
    """What the consumer saw: one row per order whose event reached it."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"published {self.order_id}"
