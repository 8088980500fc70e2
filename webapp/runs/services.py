"""Run lifecycle helpers shared by views, workers and commands."""

from __future__ import annotations

from django.conf import settings

from webapp.runs.models import RUN_LEASES, Run


def reap_stale_runs() -> int:
    """Mark `running` job runs failed when their worker's heartbeat stopped (worker
    killed, host lost): the stale leases of RUN_LEASES.

    Import runs are fed by the API from elsewhere and have no worker heartbeat: they are left alone.
    """
    n = 0
    for run in RUN_LEASES.stale().exclude(kind=Run.Kind.IMPORT):
        if run.mark_failed(
            f"worker lost: no heartbeat since {run.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC"
        ):
            n += 1
    return n


def visible_gpus() -> int:
    """CUDA devices this process's jobs may use: none when WORKER_DEVICE names the CPU."""
    if settings.WORKER_DEVICE == "cpu":
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # torch missing or a broken driver: the worker still runs CPU jobs
        return 0


def device_name() -> str:
    """The device jobs run on in this process: the worker's config, else CUDA when
    present, else CPU."""
    if settings.WORKER_DEVICE != "auto":
        return settings.WORKER_DEVICE
    gpus = visible_gpus()
    if gpus:
        import torch

        return f"cuda ({gpus}x {torch.cuda.get_device_name(0)})"
    return "cpu"


def weights_differ(runs: list[Run]) -> list[tuple[Run, dict[str, float]]] | None:
    """Each run's reward weights when they are not all the same: the aggregate reward curves then
    differ by construction, and only the per-component curves compare like with like."""
    weights = [(r, r.reward_weights()) for r in runs if r.environment_id]
    if len({tuple(sorted(w.items())) for _, w in weights}) <= 1:
        return None
    return weights
