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


DEMO_TAG = "demo_chain"  # config marker: the chain is queued once, however often `make demo` runs


def queue_demo_chain(env_name: str = "diagram") -> list[str]:
    """Queue the tiny-model chain: teacher -> SFT -> GRPO -> eval, plus an eval before SFT.

    Each stage is a run whose parent is the stage it needs (its model, or the teacher's dataset), so it
    starts when that parent succeeds. Returns lines to print.
    """
    from training.demo_chain import demo_chain_stages
    from training.environments import get_environment
    from webapp.rollouts.services import create_run, environment_from_training

    existing = list(Run.objects.filter(config__demo_chain=True).order_by("id"))
    if existing:
        return [f"demo training chain already queued ({len(existing)} runs)", _compare_line(existing)]
    env = environment_from_training(get_environment(env_name))
    owner = _demo_owner()
    runs: dict[str, Run] = {}
    lines = []
    for stage in demo_chain_stages(env_name):
        parent = runs.get(stage.data_from or "") or runs.get(stage.model_from or "")
        base_model = f"tiny:{env_name}" if stage.model_from in (None, "tiny") else f"run:{runs[stage.model_from].id}"
        config = dict(stage.config, demo_chain=True, start_after_parent=parent is not None)
        run = create_run(name=f"demo · {stage.name.replace('_', ' ')}", kind=stage.kind, environment=env,
                         config=config, owner=owner, base_model=base_model, parent=parent)
        runs[stage.name] = run
        if parent is None:
            enqueue_run(run.id)
        lines.append(f"queued run {run.id}: {run.name} ({stage.kind})"
                     + (f", after run {parent.id}" if parent else ""))
    lines.append(_compare_line(list(runs.values())))
    return lines


def _compare_line(runs: list[Run]) -> str:
    evals = "&".join(f"run={r.id}" for r in runs if r.kind == Run.Kind.EVAL)
    return f"held-out evals side by side, once they finish: /jobs/compare/?{evals}"


def _demo_owner():
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(username="demo").first()
