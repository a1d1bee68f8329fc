import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "txhub.settings")

app = Celery("txhub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
