"""The storage quota's test helpers (docs/decisions/0085): what is stored, and a measure that
publishes the groups over a test's small quota."""

import time
from collections.abc import Iterator

import pytest
from django.db import connection

from apps.broker import shared_cache, storage_quota
from apps.broker.models import CommitLogEntry, DelayedMessage, HalfMessage, RecalledMessage
from apps.broker.models_storage import StoredBytes
from apps.broker.services import storage_usage


def stored_rows() -> tuple[int, int, int, int]:
    return (
        HalfMessage.objects.count(),
        CommitLogEntry.objects.count(),
        DelayedMessage.objects.count(),
        RecalledMessage.objects.count(),
    )


def truth() -> dict[str, int]:
    """Every group's bytes, a full SUM over every table that keeps messages."""
    total: dict[str, int] = {}
    with connection.cursor() as cursor:
        for table in storage_usage.TABLES:
            group, size = table.group.format(t="r"), storage_usage.SIZE_SQL.format(t="r")
            sql = f"SELECT {group}, sum({size}) FROM {table.name} r {table.joins} GROUP BY 1"  # noqa: S608
            cursor.execute(sql)
            for name, kept in cursor.fetchall():
                total[name] = total.get(name, 0) + int(kept)
    return total


def counted() -> dict[str, int]:
    """Every group's bytes as the measure keeps them, zero and below included."""
    total: dict[str, int] = {}
    for row in StoredBytes.objects.all():
        total[row.producer_group] = total.get(row.producer_group, 0) + row.counted + row.recent
    return total


def counted_for_good(seconds: float = 60.0) -> None:
    """Measures until every row stored now is counted for good (not `recent`): the rows'
    counter is then what their deletion takes off. An id is counted for good two promotions
    after a measure first reads it, and a promotion waits for every transaction of the cluster
    that was running at the measure before (docs/decisions/0095): other tests' transactions
    (other databases of the same Postgres) can hold it back for a while."""
    deadline = time.monotonic() + seconds
    while True:
        storage_usage.storage_measure()
        with connection.cursor() as cursor:
            behind = False
            for table in storage_usage.TABLES:
                cursor.execute(
                    f"SELECT (SELECT coalesce(max({table.id_column}), 0) FROM {table.name}) "  # noqa: S608
                    "> coalesce((SELECT counted_to FROM broker_storagemeasure "
                    "WHERE stored_table = %s), 0)",
                    [table.name],
                )
                behind = behind or cursor.fetchone()[0]
        if not behind:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the stored rows were not counted for good within {seconds} s")
        time.sleep(0.1)


def measured() -> dict[str, int]:
    """Measures now, as the beat task does, and makes this process read the result at once."""
    over = storage_usage.storage_measure()
    storage_quota.forget()
    return over


@pytest.fixture
def no_quota_published() -> Iterator[None]:
    """No group over its quota before and after the test, in this process and in Redis."""
    shared_cache.cache_of("default").delete(storage_quota.OVER_QUOTA_KEY)
    storage_quota.forget()
    yield
    if shared_cache.cache_of("default").delete(storage_quota.OVER_QUOTA_KEY):
        # Server processes (web, gRPC) keep what they read for up to this long: later tests'
        # groups of the same names must find them sending again.
        time.sleep(storage_quota.REFRESH_SECONDS + 0.2)
    storage_quota.forget()
