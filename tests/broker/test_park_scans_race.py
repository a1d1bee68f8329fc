"""Two scans of the max pending age at once (docs/decisions/0111, T27): both read the same stale
transaction as PREPARED, one parks it, and the other, which waited for the row's lock, finds it
PARKED and leaves it as it is: one PARK op, not two. The park re-reads the state under its row
lock. Real concurrent transactions, each on its own connection; every thread's exception reaches
the test through its future."""

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from threading import Event

import pytest
from django.db import transaction
from django.utils import timezone

from apps.broker.models import HalfMessage, OpRecord
from apps.broker.services import checkback, registry
from tests.support.lock_waits import BOUND, until, waiting_for_a_lock
from tests.support.own_connection import on_own_connection
from tests.support.transactions import make_group, prepare

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_park_scans_at_once_park_a_stale_transaction_once() -> None:
    group, topic = make_group(), registry.topic_create(name="orders", queues=1)
    half = prepare(group, topic)
    # Past the default TXHUB_MAX_PENDING_AGE (72 h).
    HalfMessage.objects.filter(pk=half.pk).update(born_at=timezone.now() - timedelta(hours=73))
    parked_held, release = Event(), Event()

    def first_scan_held_open() -> int:
        with transaction.atomic():
            parked = checkback.checkback_park_stale()
            parked_held.set()
            assert release.wait(BOUND)
        return parked

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(on_own_connection(first_scan_held_open))
        assert parked_held.wait(BOUND)
        second = pool.submit(on_own_connection(checkback.checkback_park_stale))
        # The first scan's park is not committed: the second read the row as PREPARED and now
        # waits for its lock.
        assert until(lambda: waiting_for_a_lock("FOR UPDATE OF h"))
        release.set()
        assert first.result(timeout=BOUND) == 1
        second.result(timeout=BOUND)
    half.refresh_from_db()
    assert half.state == "PARKED"
    [park] = OpRecord.objects.filter(half=half, op="PARK")
    assert park.reason.startswith("unresolved for longer than TXHUB_MAX_PENDING_AGE")
