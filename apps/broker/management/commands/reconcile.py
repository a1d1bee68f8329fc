"""python manage.py reconcile [--date YYYY-MM-DD] [--master local[2]|spark://host:port]"""

from datetime import date, timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from apps.broker.models import RunStatus
from apps.broker.services.reconciliation import reconciliation_run


class Command(BaseCommand):
    help = "Reconciles op records, half messages and the commit log for one day (UTC) with Spark."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--date", help="the day to reconcile (default: yesterday, UTC)")
        parser.add_argument("--master", default=settings.TXHUB_SPARK_MASTER)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            day = (
                date.fromisoformat(options["date"])
                if options["date"]
                else timezone.now().date() - timedelta(days=1)
            )
        except ValueError:
            raise CommandError("--date must be YYYY-MM-DD.") from None
        run = reconciliation_run(day=day, master=options["master"])
        self.stdout.write(f"reconciliation run {run.pk} of {run.day} on {run.master}: {run.status}")
        if run.status == RunStatus.FAILED:
            raise CommandError(run.error)
        counts = run.counts
        self.stdout.write(
            f"read {counts['rows']['halves']} half messages, {counts['rows']['ops']} op records, "
            f"{counts['rows']['log']} commit-log rows; {counts['candidates']} candidates, "
            f"{counts['findings']} findings"
        )
        for kind, number in counts["by_kind"].items():
            if number:
                self.stdout.write(f"  {kind}: {number}")
        for finding in run.findings.order_by("kind", "id")[:50]:
            self.stdout.write(f"  - {finding.kind}: {finding.explanation}")
        for row in run.summary:
            self.stdout.write(
                f"  {row['producer_group']}/{row['topic']}: {row['committed']} committed, "
                f"{row['rolled_back']} rolled back (producer {row['by_producer']}, check-back "
                f"{row['by_check_back']}, operator {row['by_operator']}), {row['parked']} parked, "
                f"median {row['median_ms']} ms, p99 {row['p99_ms']} ms"
            )
