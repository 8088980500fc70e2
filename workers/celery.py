"""The Celery app. Queues: `gpu` (training jobs: one per GPU, prefetch 1, acks late) and `default`."""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("rewarddebugger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,  # state lives on the Run row, not in a result backend
    task_acks_late=True,  # a worker that dies mid-task leaves the message for another worker
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,  # a GPU worker must not hoard queued jobs it cannot run
    task_default_queue="default",
    task_queues=(Queue("default"), Queue("gpu")),
    task_routes={"workers.tasks.run_job": {"queue": "gpu"}},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
app.autodiscover_tasks(["workers"])
