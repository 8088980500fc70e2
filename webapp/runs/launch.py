"""The one launch path: create a run, queue it (now, or behind its parent), route it to a queue.

Tasks are sent by name through the app in webapp/celery.py, after the transaction that created the
run commits (a worker must never pick up a run id it cannot read yet). Also here: where a run's
output lives and how the app's model references (`tiny:<env>`, `run:<id>`) become paths.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import transaction

from training.jobs import JOBS, get_job
from webapp.runs.models import Run

RUN_JOB_TASK = "workers.tasks.run_job"
TINY_PREFIX = (
    "tiny:"  # base_model "tiny:diagram" = the offline tiny model built for that environment
)
RUN_PREFIX = (
    "run:"  # base_model "run:12" = the model that run 12 trained (chains: SFT -> GRPO -> eval)
)
DEMO_TAG = "demo_chain"  # config marker: the chain is queued once, however often `make demo` runs


def queue_for(run: Run) -> str:
    job = get_job(run.kind)
    if job.cpu_when_scripted and (run.config or {}).get("teacher", "scripted") == "scripted":
        return "default"
    return "gpu"


def enqueue_run(run_id: int) -> str:
    """Send the run's job to its queue once the current transaction commits; returns the queue."""
    from webapp.celery import app

    queue = queue_for(Run.objects.get(id=run_id))
    transaction.on_commit(lambda: app.send_task(RUN_JOB_TASK, args=[run_id], queue=queue))
    return queue


def launch_run(
    *,
    name: str,
    kind: str,
    environment,
    config: dict,
    owner=None,
    base_model: str = "",
    parent: Run | None = None,
) -> Run:
    """The one way a job run is created: create it and queue it now, or behind its parent.

    A run waits while its parent is a job still queued or running (the worker queues it when the
    parent finishes: workers.tasks._after); a parent that failed or was cancelled fails the run at
    once when the run needs its output (its model or, for SFT, a teacher's dataset), and is only
    provenance otherwise. An import run is never waited for: nothing would end the wait."""
    from webapp.rollouts.services import create_run

    get_job(kind)
    live = (Run.Status.QUEUED, Run.Status.RUNNING)
    waits = parent is not None and parent.kind in JOBS
    waits = waits and parent.status in live
    run = create_run(
        name=name,
        kind=kind,
        environment=environment,
        owner=owner,
        base_model=base_model,
        parent=parent,
        config=dict(config, start_after_parent=waits),
    )
    if waits:
        return run
    failed = (Run.Status.FAILED, Run.Status.CANCELLED)
    if parent is not None and parent.status in failed and _needs_output(run, parent):
        run.mark_failed(f"not started: parent run {parent.id} {parent.status}")
        return run
    enqueue_run(run.id)
    return run


def _needs_output(run: Run, parent: Run) -> bool:
    return run.base_model == f"{RUN_PREFIX}{parent.id}" or parent.kind == "teacher"


def twin_of(run: Run, *, name: str, owner=None, **changes) -> Run:
    """A GRPO twin of `run` (ablation, replay): the same start point (its config, base model and
    its own weights by component name), `changes` on top, recorded as the run's child and launched
    behind it while it still trains."""
    config = {**(run.config or {}), "reward_weights": run.reward_weights(), **changes}
    return launch_run(
        name=name[:200],
        kind=Run.Kind.GRPO,
        environment=run.environment,
        config=config,
        owner=owner,
        base_model=run.base_model,
        parent=run,
    )


def output_dir(run: Run) -> Path:
    return Path(settings.RUNS_DIR) / str(run.id)


def resolve_model(base_model: str) -> str:
    """Translate the app's model references into a path; anything else (a folder, a hub
    id) as given."""
    if base_model.startswith(TINY_PREFIX):
        from training.tiny import ensure_tiny_model

        return str(ensure_tiny_model(base_model[len(TINY_PREFIX) :], Path(settings.MODELS_DIR)))
    if base_model.startswith(RUN_PREFIX):
        run = Run.objects.get(id=int(base_model[len(RUN_PREFIX) :]))
        out = Path(run.output_dir or output_dir(run))
        return str(out / "model") if (out / "model").is_dir() else str(out)
    return base_model


def queue_demo_chain(env_name: str = "diagram") -> list[str]:
    """Queue the tiny-model chain: teacher -> SFT -> GRPO -> eval, plus an eval before SFT.

    Each stage is a run whose parent is the stage it needs (its model, or the teacher's dataset), so
    it starts when that parent succeeds. Returns lines to print.
    """
    from django.contrib.auth import get_user_model

    from training.demo_chain import demo_chain_stages
    from training.environments import get_environment
    from webapp.rollouts.services import environment_from_training

    existing = list(Run.objects.filter(config__demo_chain=True).order_by("id"))
    if existing:
        return [
            f"demo training chain already queued ({len(existing)} runs)",
            _compare_line(existing),
        ]
    env = environment_from_training(get_environment(env_name))
    owner = get_user_model().objects.filter(username="demo").first()
    runs: dict[str, Run] = {}
    lines = []
    for stage in demo_chain_stages(env_name):
        parent = runs.get(stage.data_from or "") or runs.get(stage.model_from or "")
        tiny = stage.model_from in (None, "tiny")
        base_model = (
            f"{TINY_PREFIX}{env_name}" if tiny else f"{RUN_PREFIX}{runs[stage.model_from].id}"
        )
        run = launch_run(
            name=f"demo · {stage.name.replace('_', ' ')}",
            kind=stage.kind,
            environment=env,
            config=dict(stage.config, demo_chain=True),
            owner=owner,
            base_model=base_model,
            parent=parent,
        )
        runs[stage.name] = run
        after = f", after run {parent.id}" if parent else ""
        lines.append(f"queued run {run.id}: {run.name} ({stage.kind}){after}")
    lines.append(_compare_line(list(runs.values())))
    return lines


def _compare_line(runs: list[Run]) -> str:
    evals = "&".join(f"run={r.id}" for r in runs if r.kind == Run.Kind.EVAL)
    return f"held-out evals side by side, once they finish: /jobs/compare/?{evals}"
