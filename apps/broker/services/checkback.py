"""Check-back: asking the producer what became of a transaction it never resolved.

The scan claims due transactions (a lease in `checking_until`, taken with SKIP LOCKED, committed
at once); a task per transaction calls the producer group's check URL outside any lock; the
answer is applied under the half row's lock only while the transaction is unresolved, through
the same commit/rollback services as the producer's own calls (CONTRACT invariant 7).

The HTTP call itself (URL policy, signing, the bounded call) is callbacks.py; a check carried by a
producer's gRPC stream is checkback_stream.py; what either writes of an attempt is check_ops.py.
"""

from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Now

from apps.broker import failpoints
from apps.broker.clock import db_now
from apps.broker.metrics import CHECKBACK_ATTEMPTS, CHECKBACK_LATENCY
from apps.broker.models import HalfMessage, Resolver
from apps.broker.models import TransactionState as State
from apps.broker.services import checkback_stream, scans, transactions
from apps.broker.services.callbacks import CheckResult, call_check_url
from apps.broker.services.check_ops import DECISIVE, checkback_resolve
from apps.broker.services.transactions import Actor

SYSTEM = Actor(Resolver.SYSTEM, "txhub")

# The scan --------------------------------------------------------------------------------------

CLAIM_SQL = """
WITH inflight AS (
    SELECT producer_group_id, count(*) AS n FROM broker_halfmessage
    WHERE state = 'PREPARED' AND checking_until > statement_timestamp()
    GROUP BY producer_group_id
),
-- Each group's own oldest due checks, up to its cap less its leases, before any global limit:
-- one group's backlog never keeps another group's due check out of a claim (CONTRACT section 7,
-- docs/decisions/0009). One probe of half_group_due_check_idx per group, reading at most its
-- cap, however long the group's backlog.
due AS (
    SELECT d.id, d.next_check_at
    FROM broker_producergroup g
    LEFT JOIN inflight ON inflight.producer_group_id = g.id
    CROSS JOIN LATERAL (
        SELECT h.id, h.next_check_at FROM broker_halfmessage h
        WHERE h.producer_group_id = g.id AND h.state = 'PREPARED'
          AND h.next_check_at <= statement_timestamp()
        ORDER BY h.next_check_at
        LIMIT greatest(%(per_group)s - coalesce(inflight.n, 0), 0)
    ) d
    WHERE %(group)s::bigint IS NULL OR g.id = %(group)s::bigint
)
UPDATE broker_halfmessage
SET checking_until = statement_timestamp() + make_interval(secs => %(lease)s),
    next_check_at = statement_timestamp() + make_interval(secs => %(lease)s)
WHERE id IN (
    SELECT h.id FROM broker_halfmessage h
    -- ARRAY(...): the candidates are chosen once, whatever plan the statistics suggest; a join
    -- may choose them again for every row it locks (docs/decisions/0063).
    WHERE h.id = ANY (ARRAY(SELECT id FROM due ORDER BY next_check_at LIMIT %(window)s))
      AND h.state = 'PREPARED' AND h.next_check_at <= statement_timestamp()
    ORDER BY h.next_check_at LIMIT %(batch)s
    FOR UPDATE OF h SKIP LOCKED
)
RETURNING id, checking_until
"""

# The task's start turns the claim's short lease into the check's lease, only if the claim is
# still the row's own (its lease's end is the fencing token) and has not run out.
START_SQL = """
UPDATE broker_halfmessage
SET checking_until = statement_timestamp() + make_interval(secs => %(lease)s),
    next_check_at = statement_timestamp() + make_interval(secs => %(lease)s)
WHERE id = %(id)s AND checking_until = %(claimed_until)s
  AND checking_until > statement_timestamp()
"""


def check_soft_time_limit() -> float:
    """The check task's soft time limit (apps/broker/tasks.py): the call's bound plus a margin;
    it raises in the task, and a check it ends inside the call is recorded as unreachable
    (docs/decisions/0009, 0064, 0083)."""
    return settings.TXHUB_CHECK_HTTP_TIMEOUT + 5


def check_time_limit() -> float:
    """The check task's hard time limit (apps/broker/tasks.py): the call's bound plus the
    backstop after it; at the limit Celery replaces the pool process."""
    return settings.TXHUB_CHECK_HTTP_TIMEOUT + 10


def check_lease() -> float:
    """A started check's lease: the task's hard time limit and a margin for the kill to land, so
    no second check starts while the first can still run. Its wait in the queue is the claim's
    own lease (docs/decisions/0049, 0064)."""
    return check_time_limit() + 5


class Claim(NamedTuple):
    """A claimed transaction and the end of its claim's lease, which only that claim holds."""

    half_id: int
    until: datetime


def checkback_claims(*, producer_group_id: int | None = None) -> list[Claim]:
    """Claims due PREPARED transactions for checking, at most N in flight per producer group
    (only that group's with `producer_group_id`): each group's oldest due checks up to its cap,
    then the oldest of those up to TXHUB_CHECK_BATCH.

    Lock, SKIP LOCKED: two scans (or a scan racing a commit) never claim the same row; a row being
    resolved right now is skipped and, once resolved, is no longer PREPARED. The claim moves
    next_check_at to the lease's end, so a check whose task never started (lost with Redis or
    its worker) is due again after TXHUB_CHECK_DISPATCH_LEASE (docs/decisions/0049); the task,
    when it starts, takes the check's own lease with checkback_start.
    """
    # The database clock throughout (apps/broker/clock.py): a worker's own clock never decides.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            CLAIM_SQL,
            {
                "lease": settings.TXHUB_CHECK_DISPATCH_LEASE,
                "window": settings.TXHUB_CHECK_BATCH * 4,
                "batch": settings.TXHUB_CHECK_BATCH,
                "per_group": settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP,
                "group": producer_group_id,
            },
        )
        return [Claim(*row) for row in cursor.fetchall()]


def checkback_claim_due(*, producer_group_id: int | None = None) -> list[int]:
    """checkback_claims, the ids only."""
    return [claim.half_id for claim in checkback_claims(producer_group_id=producer_group_id)]


def checkback_start(claim: Claim) -> bool:
    """The claim's task starts: True, and the row holds the check's lease (check_lease), when
    the claim is still its own and alive. False when it ran out before the task started (the
    row is due again, or another scan claimed it since): the task must not check, so one
    transaction is never checked twice at once (docs/decisions/0005, 0049)."""
    with connection.cursor() as cursor:
        cursor.execute(
            START_SQL,
            {
                "lease": check_lease(),
                "id": claim.half_id,
                "claimed_until": claim.until,
            },
        )
        return bool(cursor.rowcount == 1)


def checkback_claims_next(*, after: int) -> list[Claim]:
    """The group's next due checks, claimed when one of its checks ends (`after`, a half id).

    Without this a group's checks advance only once per scan: at most the per-group cap per
    TXHUB_SCAN_SECONDS, so a producer that crashed with a thousand open transactions (or a
    backlog left by checks whose workers died) drains at a couple of checks a second. The freed
    slot is refilled at once instead; the cap and the lease are the scan's."""
    group = HalfMessage.objects.filter(pk=after).values_list("producer_group_id", flat=True)
    for producer_group_id in group:
        return checkback_claims(producer_group_id=producer_group_id)
    return []


def checkback_claim_next(*, after: int) -> list[int]:
    """checkback_claims_next, the ids only."""
    return [claim.half_id for claim in checkback_claims_next(after=after)]


def checkback_park_stale() -> int:
    """PREPARED for longer than TXHUB_MAX_PENDING_AGE -> PARKED, whatever the checks said.

    Returns how many rows it parked (tasks.checkback_scan logs it). Row by row: a row that cannot
    be read back is logged, counted and skipped (scans.py), and the claim that follows in the same
    scan still runs for every other group."""
    # Postgres' clock, in the query itself (one statement a scan, not two).
    cutoff = Now() - timedelta(seconds=settings.TXHUB_MAX_PENDING_AGE)
    stale = HalfMessage.objects.filter(state=State.PREPARED, born_at__lt=cutoff).exclude(
        pk__in=scans.skipped("checkback_park_stale")
    )
    rows = list(stale.values_list("pk", "transaction_id")[: settings.TXHUB_CHECK_BATCH])
    parked = 0
    for pk, transaction_id in rows:
        try:
            with transaction.atomic():
                # A row resolved between this scan's read and its lock is left as it is and
                # not counted: the count is what the scan parked (docs/decisions/0110).
                done = transactions.transaction_park(
                    transaction_id=transaction_id,
                    actor=SYSTEM,
                    reason=f"unresolved for longer than TXHUB_MAX_PENDING_AGE "
                    f"({settings.TXHUB_MAX_PENDING_AGE:.0f} s)",
                )
            parked += 1 if done else 0
        except scans.UNREADABLE as error:
            scans.row_failed("checkback_park_stale", pk, error)
    return parked


def checkback_run(*, half_id: int) -> str:
    """One check of one claimed transaction. Returns what happened, for logs and tests."""
    try:
        half = (
            HalfMessage.objects.select_related("producer_group", "topic").filter(pk=half_id).first()
        )
    except scans.UNREADABLE as error:
        # Unreadable (scans.py): no check can be built for it. Not claimed again for a day, so
        # it is not retried every lease; logged and counted for an operator to repair.
        scans.row_failed("checkback_run", half_id, error)
        HalfMessage.objects.filter(pk=half_id).update(
            checking_until=None, next_check_at=db_now() + timedelta(days=1)
        )
        return "unreadable"
    if half is None or half.state != State.PREPARED:
        # Resolved since the claim: never send a check for it (invariant 7).
        HalfMessage.objects.filter(pk=half_id).update(checking_until=None)
        return "skipped"
    if failpoints.ARMED:
        failpoints.hit("after_check_read_before_lock")
    # A RocketMQ producer of the group connected to a gRPC process: asked on its stream, and its
    # answer comes back as EndTransaction (checkback_stream.checkback_answer). Otherwise HTTP.
    with transaction.atomic():
        # Lock: the producer's answer to this check (checkback_stream.checkback_answer) waits
        # until the check's record names the client it was sent to, and a commit or rollback
        # since the read above is seen here, so no check goes out for it (invariant 7). Held
        # across one Redis connect and PUBLISH (2 s each at most, checkback_stream), never
        # across the HTTP call.
        half = (
            HalfMessage.objects.select_for_update(of=("self",))
            .select_related("producer_group", "topic")
            .filter(pk=half_id)
            .first()
        )
        if half is None or half.state != State.PREPARED:
            HalfMessage.objects.filter(pk=half_id).update(checking_until=None)
            return "skipped"
        if failpoints.ARMED:
            failpoints.hit("before_check_send")
        sent_to = checkback_stream.checkback_send(half=half)
        if sent_to is not None:
            result = CheckResult("UNKNOWN", True, None, "", 0, "", via=sent_to)
            return checkback_apply(half_id=half_id, result=result)
    result = call_check_url(half)
    if failpoints.ARMED:
        failpoints.hit("after_check_answer_before_write")
    return checkback_apply(half_id=half_id, result=result)


def checkback_apply(*, half_id: int, result: CheckResult) -> str:
    now = db_now()
    detail = {
        "answer": result.answer,
        "reached": result.reached,
        "status": result.status,
        "error": result.error,
        "latency_ms": result.latency_ms,
        "webhook_id": result.webhook_id,
        **result.via,
    }
    CHECKBACK_ATTEMPTS.labels(result=result.answer if result.reached else "unreachable").inc()
    if result.reached:
        CHECKBACK_LATENCY.observe(result.latency_ms / 1000)
    with transaction.atomic():
        # Lock: a late producer commit/rollback or an operator action on the same transaction
        # waits here (or we wait for it), so the answer applies only while still unresolved.
        half = HalfMessage.objects.select_for_update(of=("self",)).filter(pk=half_id).first()
        if half is None:
            return "gone"
        resolved = checkback_resolve(
            half, detail=detail, now=now, carrier="the producer's check URL"
        )
        if resolved is not None:
            # The check is over: its lease ends; an answer that decided counts as a check.
            counted = {"check_times": F("check_times") + 1, "unreachable_checks": 0}
            HalfMessage.objects.filter(pk=half_id).update(
                checking_until=None, **(counted if resolved in DECISIVE else {})
            )
            return resolved
        half.checking_until = None
        if result.reached:
            half.check_times += 1
            half.unreachable_checks = 0
            half.next_check_at = now + timedelta(seconds=settings.TXHUB_CHECK_INTERVAL)
        else:
            half.unreachable_checks += 1
            backoff = min(2 ** (half.unreachable_checks - 1), settings.TXHUB_CHECK_MAX_BACKOFF)
            half.next_check_at = now + timedelta(seconds=backoff)
        half.save(
            update_fields=["checking_until", "check_times", "unreachable_checks", "next_check_at"]
        )
        if half.check_times >= settings.TXHUB_CHECK_MAX:
            transactions.transaction_park(
                transaction_id=half.transaction_id,
                actor=SYSTEM,
                reason=f"no decision after {half.check_times} checks (TXHUB_CHECK_MAX)",
            )
            return "parked"
        return "unknown" if result.reached else "unreachable"
