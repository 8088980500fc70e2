"""The Celery app, configured from Django settings (the CELERY_ names in webapp/settings.py).

It lives beside the settings so that the web process can send tasks by name without importing
`workers` (webapp never imports workers; workers imports webapp). The tasks themselves are in
workers/tasks.py, registered when a worker starts with `celery -A workers worker`.
"""

from __future__ import annotations

import os

from celery import Celery
from django.conf import settings
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("rewarddebugger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = tuple(Queue(name) for name in settings.WORKER_QUEUES)
