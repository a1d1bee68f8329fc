"""One bad row never stops a scan (issue 9, "poisoned state").

A row Postgres stores but the driver cannot read back (a timestamp before year 1, say) would fail
every batch it belongs to, and a scan that stops on it stops for every other row too. The scans
load rows in batches and, when a batch fails, row by row: the bad one is logged with its id,
counted in txhub_scan_rows_failed_total{scan=...} and left out of that scan in this process from
then on (it is not retried every second; an operator repairs or deletes it, then restarts)."""

import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, TypeVar

from django.db import DataError, transaction
from django.db.models import Model, QuerySet

from apps.broker.metrics import SCAN_ROWS_FAILED

logger = logging.getLogger(__name__)

# What reading an unreadable value raises: psycopg's conversion errors, which Django wraps in
# DataError; ValueError/OverflowError from Python's own datetime and number types.
UNREADABLE = (DataError, ValueError, OverflowError)

M = TypeVar("M", bound=Model)

_skipped: dict[str, set[Any]] = defaultdict(set)


def skipped(scan: str) -> set[Any]:
    """The ids this process's `scan` has given up on (to leave out of its queries)."""
    return _skipped[scan]


def row_failed(scan: str, pk: Any, error: BaseException) -> None:
    _skipped[scan].add(pk)
    SCAN_ROWS_FAILED.labels(scan=scan).inc()
    logger.error(
        "scan %s: row %s cannot be processed and is skipped from now on (%s: %s)",
        scan,
        pk,
        type(error).__name__,
        error,
    )


def load_rows(queryset: QuerySet[M], ids: Iterable[Any], *, scan: str) -> list[M]:
    """The rows of `ids`, in one query when they all read; otherwise one by one, each in a
    savepoint, the unreadable ones reported and left out."""
    ids = list(ids)
    if not ids:
        return []
    try:
        with transaction.atomic():
            return list(queryset.filter(pk__in=ids))
    except UNREADABLE:
        pass  # one of them is bad: find which, below
    rows: list[M] = []
    for pk in ids:
        try:
            with transaction.atomic():
                rows.extend(queryset.filter(pk=pk))
        except UNREADABLE as error:
            row_failed(scan, pk, error)
    return rows
