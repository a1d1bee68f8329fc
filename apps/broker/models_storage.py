"""What each producer group keeps stored, as the storage measure counts it
(services/storage_usage.py, docs/decisions/0085); apps.broker.models re-exports them."""

from django.db import models
from django.utils import timezone


class StorageMeasure(models.Model):
    """How far the measure has read one table of messages, by id: rows up to `counted_to` are in
    their groups' `StoredBytes.counted`; `counted_to` moves to `seen_to` once no transaction
    older than `seen_horizon` (the first xid not yet begun at the measure that set them) runs;
    `pending_to`, the top id that measure saw, becomes `seen_to` then (docs/decisions/0095)."""

    stored_table = models.CharField(max_length=63, unique=True)
    counted_to = models.BigIntegerField(default=0)
    seen_to = models.BigIntegerField(default=0)
    seen_horizon = models.BigIntegerField(default=0)
    pending_to = models.BigIntegerField(default=0)
    measured_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.stored_table} to {self.counted_to}"


class StoredBytes(models.Model):
    """The bytes one producer group keeps in one table: `counted`, of its rows up to the table's
    `StorageMeasure.counted_to` that are still there; `recent`, of its rows above it, as the last
    measure found them."""

    producer_group = models.CharField(max_length=127)
    stored_table = models.CharField(max_length=63)
    counted = models.BigIntegerField(default=0)
    recent = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["producer_group", "stored_table"], name="stored_bytes_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.producer_group} in {self.stored_table}: {self.counted + self.recent}"
