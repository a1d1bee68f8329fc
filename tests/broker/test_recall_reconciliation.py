"""A committed delayed transaction recalled before its delivery is in neither the commit log
nor the delayed table: the reconciliation's re-check (spark_jobs/recheck.py) does not report it
as a lost commit, and still reports a commit that is really lost (docs/decisions/0055)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.broker import access
from apps.broker.models import DelayedMessage
from apps.broker.services import recall, registry, transactions
from spark_jobs.recheck import still_true
from tests.conftest import db_url_for_tests
from tests.support.transactions import PRODUCER, make_group, prepare


@pytest.mark.django_db(transaction=True)
def test_a_recalled_commit_is_not_a_lost_commit() -> None:
    topic = registry.topic_create(name="orders", queues=1)
    group = make_group()
    later = timezone.now() + timedelta(hours=1)
    recalled, lost = (
        prepare(group, topic, deliver_at=later),
        prepare(group, topic, deliver_at=later),
    )
    for half in (recalled, lost):
        transactions.transaction_commit(transaction_id=half.transaction_id, actor=PRODUCER)
    token, _ = registry.token_create(name="shop-token", scopes=["produce:shop"])
    principal = access.by_id(token.pk)
    assert principal is not None
    recall.message_recall(msg_id=recalled.msg_id, principal=principal, door="rest")
    DelayedMessage.objects.filter(msg_id=lost.msg_id).delete()  # behind txhub's back

    candidates = [
        {"kind": "LOST_COMMIT", "transaction_id": str(half.transaction_id)}
        for half in (recalled, lost)
    ]
    confirmed = still_true(db_url_for_tests(), candidates, max_pending_age=3600)
    assert [c["transaction_id"] for c in confirmed] == [str(lost.transaction_id)]
