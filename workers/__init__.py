"""Celery workers: the only glue between webapp (Django) and training (plain Python)."""

from workers.celery import app as celery_app

__all__ = ["celery_app"]
