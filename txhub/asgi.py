"""ASGI entry point: `gunicorn -k txhub.worker.TxhubWorker txhub.asgi:application` (make run; the
worker is uvicorn's, sending each answer in one write: txhub/worker.py). See txhub/web.py and
docs/decisions/0024."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")
django.setup(set_prefix=False)

from txhub.web import TxhubASGIHandler  # noqa: E402 - needs the apps loaded

application = TxhubASGIHandler()
