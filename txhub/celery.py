import logging
import os
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")

app = Celery("txhub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Database connections across tasks. Celery's Django fixup closes every connection before and after
# each task and, in a prefork worker with Django's pool, the pool itself: every task (three scans a
# second) started a new Postgres backend (fork, authentication, time zone), 3-4 connections a
# second on an idle txhub (issue 10, idle cost). Told to reuse them (it then closes nothing for a
# billion tasks), it leaves the connections to Django's own rule, run around each task as around
# each web request: a connection goes back to the process's pool at the end of its task (or, with
# TXHUB_DB_POOL=0, stays open until CONN_MAX_AGE), and one that failed is dropped. A connection
# that Postgres closed in between (a restart) is replaced by the pool's checkout check
# (txhub/postgres/base.py), as in the web tier.
app.conf.CELERY_DB_REUSE_MAX = 10**9


@task_prerun.connect  # type: ignore[untyped-decorator]  # celery is untyped
@task_postrun.connect  # type: ignore[untyped-decorator]
def connections_as_around_a_request(task: Any = None, **_: Any) -> None:
    from django.db import close_old_connections

    # Not for a task run eagerly, inside its caller's transaction (the fixup skips those too).
    if not getattr(getattr(task, "request", None), "is_eager", False):
        close_old_connections()


# Celery logs "Task ... received" and "Task ... succeeded" at INFO for every task: with scans
# every second that is several lines a second of nothing. Those two loggers are quiet unless
# TXHUB_TASK_LOG_LEVEL says otherwise; failures (ERROR) and our own tasks' lines when they did
# something still show.
QUIET_LOGGERS = ("celery.app.trace", "celery.worker.strategy")


@after_setup_logger.connect  # type: ignore[untyped-decorator]  # celery is untyped
def quiet_task_chatter(**_: Any) -> None:
    level = os.environ.get("TXHUB_TASK_LOG_LEVEL", "WARNING").upper()
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(level)
