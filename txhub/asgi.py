"""ASGI entry point: `gunicorn -k uvicorn_worker.UvicornWorker txhub.asgi:application` (make run).
See txhub/web.py and docs/decisions/0024."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")
django.setup(set_prefix=False)

from txhub.web import TxhubASGIHandler  # noqa: E402 - needs the apps loaded

application = TxhubASGIHandler()
