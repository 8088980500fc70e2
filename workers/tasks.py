"""Celery tasks. Each takes ids, treats a missing row as a clean exit, and returns a one-line summary."""

from __future__ import annotations

import logging

from workers.celery import app

log = logging.getLogger(__name__)


@app.task(name="workers.tasks.recompute_run_stats", queue="default")
def recompute_run_stats(run_id: int) -> str:
    from webapp.rollouts.services import recompute_run_stats as recompute
    from webapp.runs.models import Run

    try:
        run = Run.objects.get(id=run_id)
    except Run.DoesNotExist:
        return f"run {run_id} no longer exists"
    out = recompute(run)
    return f"run {run_id}: recomputed {out['groups']} groups, {out['rollouts']} rollouts"
