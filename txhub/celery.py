import os
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")

app = Celery("txhub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def mark_ready(sender: Any = None, **_: Any) -> None:
    """scripts/run.sh prints its start-up banner once every worker has said it is ready, so the
    banner is the last line before traffic: it sets TXHUB_READY_DIR and waits for these files."""
    ready_dir = os.environ.get("TXHUB_READY_DIR")
    if ready_dir and sender is not None:
        Path(ready_dir, f"{sender.hostname}.ready").touch()


worker_ready.connect(mark_ready)
