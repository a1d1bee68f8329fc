"""A check-back answer decides with the database's clock, not the worker's (CONTRACT invariant 8,
docs/decisions/0020): a Celery worker whose clock runs ahead commits a delayed message as
delayed, never as visible at once."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from apps.broker.clock import db_now
from apps.broker.models import CommitLogEntry, DelayedMessage
from apps.broker.services import checkback, registry
from tests.support.transactions import make_group, prepare, result

SKEW = timedelta(seconds=600)  # what chaos case F12 gives the Celery side (libfaketime)


def skew_this_processs_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on this process's clock (the worker's) runs SKEW ahead of the database's: the
    fault F12 injects with libfaketime, here for the Python clock Django reads."""
    real_now = timezone.now

    def ahead() -> datetime:
        return real_now() + SKEW

    monkeypatch.setattr(timezone, "now", ahead)


def test_a_check_back_commit_of_a_message_not_yet_due_by_the_database_clock_is_delayed(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    deliver_at = db_now() + timedelta(seconds=300)
    half = prepare(group, topic, deliver_at=deliver_at)
    skew_this_processs_clock(monkeypatch)  # from here on, as the skewed worker
    assert timezone.now() > deliver_at  # the fault bites: due by the worker's clock
    assert checkback.checkback_apply(half_id=half.pk, result=result("COMMIT")) == "COMMIT"
    half.refresh_from_db()
    assert half.state == "COMMITTED"
    assert not CommitLogEntry.objects.filter(transaction_id=half.transaction_id).exists()
    [delayed] = DelayedMessage.objects.filter(transaction_id=half.transaction_id)
    assert delayed.deliver_at == half.deliver_at == deliver_at
    assert half.resolved_at is not None
    assert half.resolved_at < deliver_at
