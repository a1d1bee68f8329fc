"""What a check sends the producer (CONTRACT section 4, docs/decisions/0110): the body's
`check_times` is the number of answered checks before this one, and a rotated-out signing secret
signs beside the new one only while TXHUB_SECRET_ROTATION_GRACE lasts. The check task runs
against a real HTTP server of the test's own (tests/checker.py), which verifies signatures with
its own code; the secret is rotated through REST."""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from apps.broker.models import HalfMessage, ProducerGroup
from apps.broker.services import checkback, registry
from tests.checker import verify
from tests.support.responses import expect
from tests.support.transactions import make_due, make_group, prepare


def check_now(half: HalfMessage, checker: Any) -> dict[str, Any]:
    """Makes the transaction due, runs the check task once, and returns the request it sent."""
    sent_before = len(checker.checks_of(str(half.transaction_id)))
    make_due(half)
    assert checkback.checkback_claim_due() == [half.pk]
    assert checkback.checkback_run(half_id=half.pk) == "unknown"
    *earlier, request = checker.checks_of(str(half.transaction_id))
    assert len(earlier) == sent_before  # one request a check
    return dict(request)


def test_check_times_counts_the_answered_checks_before_this_one(db: None, checker: Any) -> None:
    group, topic = make_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)  # the checker answers UNKNOWN: an answered check, no decision
    sent = [check_now(half, checker)["body"]["check_times"] for _ in range(3)]
    assert sent == [0, 1, 2]
    half.refresh_from_db()
    assert (half.state, half.check_times) == ("PREPARED", 3)


def test_the_previous_secret_signs_only_during_its_grace(api: APIClient, checker: Any) -> None:
    group, topic = make_group(checker.url), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    old = group.signing_secret
    new = expect(api.post(f"/api/v1/producer-groups/{group.name}/rotate-secret"), 200)[
        "signing_secret"
    ]
    grace = timedelta(seconds=settings.TXHUB_SECRET_ROTATION_GRACE)
    rotated = ProducerGroup.objects.filter(pk=group.pk)

    # The positive control: a minute before the grace ends, both secrets sign.
    rotated.update(secret_rotated_at=timezone.now() - grace + timedelta(minutes=1))
    request = check_now(half, checker)
    assert len(request["headers"]["webhook-signature"].split(" ")) == 2
    assert verify(old, request["headers"], request["raw"])
    assert verify(new, request["headers"], request["raw"])

    # A second after it ended, only the new one does.
    rotated.update(secret_rotated_at=timezone.now() - grace - timedelta(seconds=1))
    request = check_now(half, checker)
    assert len(request["headers"]["webhook-signature"].split(" ")) == 1
    assert verify(new, request["headers"], request["raw"])
    assert not verify(old, request["headers"], request["raw"])
