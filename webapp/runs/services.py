"""Run lifecycle helpers shared by views, workers and commands."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from webapp.runs.models import Run

STALE_BEATS = 6  # a run whose worker missed this many heartbeats is presumed lost


def reap_stale_runs() -> int:
    """Mark `running` job runs failed when their worker's heartbeat stopped (worker killed, host lost).

    Import runs are fed by the API from elsewhere and have no worker heartbeat: they are left alone.
    """
    cutoff = timezone.now() - timedelta(seconds=settings.WORKER_HEARTBEAT_SECONDS * STALE_BEATS)
    stale = Run.objects.filter(status=Run.Status.RUNNING, heartbeat_at__lt=cutoff).exclude(kind=Run.Kind.IMPORT)
    n = 0
    for run in stale:
        if run.mark_failed(f"worker lost: no heartbeat since {run.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC"):
            n += 1
    return n


def device_name() -> str:
    """The device jobs run on in this process: the worker's config, else CUDA when present, else CPU."""
    if settings.WORKER_DEVICE != "auto":
        return settings.WORKER_DEVICE
    try:
        import torch

        if torch.cuda.is_available():
            return f"cuda ({torch.cuda.device_count()}x {torch.cuda.get_device_name(0)})"
    except Exception:  # torch missing or a broken driver: the worker still runs CPU jobs
        pass
    return "cpu"
