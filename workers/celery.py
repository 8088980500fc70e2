"""The worker's view of the Celery app (defined once in webapp/celery.py): it adds the tasks."""

from __future__ import annotations

from webapp.celery import app

app.autodiscover_tasks(["workers"])

__all__ = ["app"]
