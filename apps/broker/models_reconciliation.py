"""The nightly reconciliation's runs and findings (spark_jobs/reconcile.py), apart from the
broker's own tables; apps.broker.models re-exports them."""

from django.db import models
from django.utils import timezone


class RunStatus(models.TextChoices):
    RUNNING = "RUNNING"
    OK = "OK"  # finished, nothing disagrees
    FINDINGS = "FINDINGS"  # finished, something disagrees: see the findings
    FAILED = "FAILED"  # did not finish: see `error`


class ReconciliationRun(models.Model):
    """One run of the nightly reconciliation (spark_jobs/reconcile.py), kept even if it failed."""

    day = models.DateField()
    master = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Rows read per table, candidates, findings per kind, seconds per phase.
    counts = models.JSONField(default=dict, blank=True)
    # Per producer group and topic: committed, rolled back, by whom, parked, time to resolution.
    summary = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["-started_at"], name="reconcile_run_started_idx")]

    def __str__(self) -> str:
        return f"{self.day} {self.status}"


class ReconciliationFinding(models.Model):
    """One disagreement between half messages, op records and the commit log."""

    run = models.ForeignKey(ReconciliationRun, on_delete=models.CASCADE, related_name="findings")
    kind = models.CharField(max_length=32)
    transaction_id = models.UUIDField(null=True, blank=True)
    half_id = models.BigIntegerField(null=True, blank=True)
    log_offset = models.BigIntegerField(null=True, blank=True)
    delayed_id = models.BigIntegerField(null=True, blank=True)
    explanation = models.TextField()

    class Meta:
        indexes = [models.Index(fields=["run", "kind"], name="finding_run_kind_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.transaction_id}"
