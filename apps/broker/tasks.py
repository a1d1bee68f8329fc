"""Celery tasks: thin, idempotent, no arguments but ids; each calls one service.

Beat triggers the scans every second; the scans read what is due from Postgres, so a lost task
message is repaired by the next scan. No ETA lives in Redis: due times are in Postgres.
"""

import logging
from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from celery.signals import worker_init
from django.conf import settings
from django.utils import timezone

from apps.broker.services import (
    checkback,
    clients,
    dead_letters,
    delivery,
    idempotency,
    reconciliation,
    retention,
    storage_usage,
)

logger = logging.getLogger(__name__)


def _did(scan: str, **counts: int) -> None:
    """INFO when a scan did something, DEBUG when it did not: an idle txhub is a quiet one."""
    level = logging.INFO if any(counts.values()) else logging.DEBUG
    logger.log(level, "%s: %s", scan, ", ".join(f"{k} {v}" for k, v in counts.items()))


@worker_init.connect
def warn_if_one_group_can_fill_the_callbacks(**_: Any) -> None:
    """A per-group cap at or above the callback concurrency lets one slow group hold every
    callback slot: a slow group could then starve the others (decision 0009)."""
    cap, slots = settings.TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP, settings.TXHUB_CALLBACK_CONCURRENCY
    if cap >= slots:
        logger.warning(
            "TXHUB_CHECK_MAX_INFLIGHT_PER_GROUP (%d) >= TXHUB_CALLBACK_CONCURRENCY (%d): one slow "
            "producer group can occupy every callback worker; keep the cap below the concurrency.",
            cap,
            slots,
        )


@shared_task(acks_late=True)
def checkback_scan() -> int:
    """Claims due transactions (a lease in Postgres) and hands each to checkback_run."""
    parked = checkback.checkback_park_stale()
    claimed = checkback.checkback_claims()
    for claim in claimed:
        checkback_run.delay(claim.half_id, claim.until.isoformat())
    _did("checkback_scan", claimed=len(claimed), parked=parked)
    return len(claimed)


# Not task_reject_on_worker_lost: a check that died mid-call is not redelivered by the broker;
# its lease expires and the next scan claims it again, so a check is never run twice at once.
# A task that never started (lost with Redis or its worker) holds only the claim's short lease;
# one that starts after its claim ran out does nothing (docs/decisions/0049).
# The call itself is bounded by TXHUB_CHECK_HTTP_TIMEOUT; the time limits are the backstop just
# above it (the soft one raises in the task, the hard one replaces the pool process). Routed to
# the "callbacks" queue (CELERY_TASK_ROUTES).
@shared_task(
    acks_late=True,
    soft_time_limit=checkback.check_soft_time_limit(),
    time_limit=checkback.check_time_limit(),
)
def checkback_run(half_id: int, claimed_until: str) -> str:
    try:
        claim = checkback.Claim(half_id, datetime.fromisoformat(claimed_until))
        if not checkback.checkback_start(claim):
            logger.info("check-back of half message %d: claim ran out before it started", half_id)
            return "claim-ran-out"
        outcome = checkback.checkback_run(half_id=half_id)
        logger.info("check-back of half message %d: %s", half_id, outcome)
        return outcome
    finally:
        # The group's freed slot goes to its next due check now, not at the next scan.
        for claim in checkback.checkback_claims_next(after=half_id):
            checkback_run.delay(claim.half_id, claim.until.isoformat())


@shared_task(acks_late=True)
def delayed_delivery_scan() -> int:
    """Moves due delayed messages into the commit log until the next beat (~1 s)."""
    moved = delivery.delayed_deliver_for(seconds=settings.TXHUB_DELIVERY_SCAN_SPAN)
    _did("delayed_delivery_scan", delivered=moved)
    return moved


@shared_task(acks_late=True)
def deliveries_expire_scan() -> int:
    """Dead-letters exhausted in-flight messages even where no consumer is receiving."""
    expired = dead_letters.deliveries_expire()
    _did("deliveries_expire_scan", dead_lettered=expired)
    return expired


@shared_task(acks_late=True)
def retention_sweep() -> dict[str, int]:
    swept = retention.retention_sweep()
    swept["idempotency_keys"] = idempotency.idempotency_sweep()
    swept["grpc_clients"] = clients.clients_sweep()
    _did("retention_sweep", **swept)
    return swept


@shared_task(acks_late=True)
def storage_measure() -> int:
    """Measures what each producer group keeps stored and publishes who is over its quota."""
    over = storage_usage.storage_measure()
    _did("storage_measure", over_quota=len(over))
    return len(over)


# Not acks_late: a run lost with its worker shows as a FAILED (or missing) run on the console,
# and running Spark twice at night for the same day helps nobody.
@shared_task(acks_late=False)
def reconcile_nightly() -> str:
    yesterday = timezone.now().date() - timedelta(days=1)
    master = settings.TXHUB_SPARK_MASTER
    run = reconciliation.reconciliation_run_nightly(day=yesterday, master=master)
    return f"{yesterday} already run by another beat" if run is None else f"{run.day} {run.status}"
