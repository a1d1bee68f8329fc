import logging
import os
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")

app = Celery("txhub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

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
