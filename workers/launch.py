"""Queueing runs: routing by kind, and the demo chain (teacher -> SFT -> GRPO -> eval)."""

from __future__ import annotations

from webapp.runs.models import Run

CPU_KINDS_WHEN_SCRIPTED = ("teacher",)  # a scripted teacher needs no GPU


def queue_for(run: Run) -> str:
    cfg = run.config or {}
    if run.kind in CPU_KINDS_WHEN_SCRIPTED and cfg.get("teacher", "scripted") == "scripted":
        return "default"
    return "gpu"


def enqueue_run(run_id: int) -> str:
    from workers.tasks import run_job

    run = Run.objects.get(id=run_id)
    queue = queue_for(run)
    run_job.apply_async(args=[run_id], queue=queue)
    return queue
