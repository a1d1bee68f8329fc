"""A check-back answer decides with the database's clock, not the worker's (CONTRACT invariant 8,
docs/decisions/0020): a Celery worker whose clock runs ahead commits a delayed message as
delayed, never as visible at once.

The worker is a process of the test's own whose clock really runs ahead: libfaketime, as chaos
case F12 runs Celery (tests/support/skewed_clock.py, docs/decisions/0102)."""

from datetime import datetime, timedelta

from apps.broker.clock import db_now
from apps.broker.models import CommitLogEntry, DelayedMessage
from apps.broker.services import registry
from tests.support.skewed_clock import run_ahead
from tests.support.transactions import make_group, prepare

SKEW_SECONDS = 600  # what chaos case F12 gives the Celery side


def test_a_check_back_commit_of_a_message_not_yet_due_by_the_database_clock_is_delayed(
    transactional_db: None,
) -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    deliver_at = db_now() + timedelta(seconds=300)
    half = prepare(group, topic, deliver_at=deliver_at)
    # The worker's process asserts first that by its own clock the message is due already.
    applied = run_ahead(
        SKEW_SECONDS, "checkback_commit", half_id=half.pk, deliver_at=deliver_at.isoformat()
    )
    assert datetime.fromisoformat(applied["own_now"]) > deliver_at  # the fault bites
    assert applied["applied"] == "COMMIT"
    half.refresh_from_db()
    assert half.state == "COMMITTED"
    assert not CommitLogEntry.objects.filter(transaction_id=half.transaction_id).exists()
    [delayed] = DelayedMessage.objects.filter(transaction_id=half.transaction_id)
    assert delayed.deliver_at == half.deliver_at == deliver_at
    assert half.resolved_at is not None
    assert half.resolved_at < deliver_at
