"""Launching, watching, cancelling and comparing training jobs (trainer role to change anything)."""

from __future__ import annotations

import json

from django.contrib import messages
from django.db.models import Count, F, Sum
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from training.environments import get_environment
from training.jobs import JOBS, RUN_KINDS
from webapp.accounts.roles import require_role
from webapp.figures import escape_figure, escaped
from webapp.rollouts.models import Group as RolloutGroup
from webapp.rollouts.models import GroupComponentStat
from webapp.rollouts.services import environment_from_training
from webapp.runs.access import get_run_for
from webapp.runs.base_models import check_base, default_base_model
from webapp.runs.forms import LaunchForm
from webapp.runs.launch import launch_run, queue_for
from webapp.runs.models import Run, StepMetric, WorkerHeartbeat
from webapp.runs.queries import component_series, reward_series
from webapp.runs.services import weights_differ

LAUNCH_TITLES = {kind: job.title for kind, job in JOBS.items()}


def launch(request: HttpRequest, kind: str) -> HttpResponse:
    require_role(request, "trainer")
    if kind not in JOBS:
        raise Http404("unknown job kind")
    env = request.GET.get(
        "environment", "diagram"
    )  # the launch page reloads with it: weights are per environment
    default, sft = default_base_model(kind, env)
    initial = {"environment": env, "base_model": request.GET.get("base_model", default)}
    if request.GET.get("parent"):
        initial["parent"] = request.GET["parent"]
    form = LaunchForm(kind, request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        run = start_job(kind, form.cleaned_data, request.user)
        # Tagged with the run: the page's poll rewrites the note once the run starts or ends.
        messages.success(
            request,
            f"Run {run.id} {'queued' if run.status == 'queued' else run.status}.",
            extra_tags=f"run-flash run-flash-{run.id}",
        )
        return redirect("jobs-detail", run_id=run.id)
    base = form.data.get("base_model") if form.is_bound else initial["base_model"]
    env = form.data.get("environment", env) if form.is_bound else env
    return render(
        request,
        "jobs/launch.html",
        {
            "form": form,
            "kind": kind,
            "title": JOBS[kind].title,
            "kinds": LAUNCH_TITLES,
            "sft_default": sft if initial["base_model"] == default else None,
            "base_check": form.base_check or check_base(kind, env, base or ""),
        },
    )


def start_job(kind: str, data: dict, owner) -> Run:
    """Create the run and queue it now, or behind its parent when the parent has not finished."""
    env = environment_from_training(get_environment(data["environment"]))
    config = dict(data["config"], num_gpus=data.get("num_gpus") or 1)
    return launch_run(
        name=data["name"],
        kind=kind,
        environment=env,
        config=config,
        owner=owner,
        base_model=data.get("base_model") or "",
        parent=data.get("parent"),
    )


def checkpoint_state(run: Run) -> str | None:
    """ "ready" when the run saved a model, "pending" when it may still (a chain can queue behind
    it), None when it never will (failed, cancelled, being cancelled, or a kind that trains
    nothing)."""
    if not RUN_KINDS[run.kind].produces_model:
        return None
    if run.status == Run.Status.SUCCEEDED:
        return "ready"
    if run.status in (Run.Status.QUEUED, Run.Status.RUNNING) and not run.cancel_requested:
        return "pending"
    return None


def queue_info(run: Run) -> dict | None:
    """For a queued run: the queue it waits in and the live workers that listen
    on it (heartbeats)."""
    from django.conf import settings

    if run.status != Run.Status.QUEUED:
        return None
    if (run.config or {}).get("start_after_parent") and run.parent_id:
        return {"parent": run.parent}
    queue = queue_for(run)
    max_age = settings.WORKER_HEARTBEAT_SECONDS * 3
    alive = [w for w in WorkerHeartbeat.objects.order_by("name") if w.is_alive(max_age)]
    listening = [w for w in alive if queue in [q.strip() for q in (w.queues or "").split(",")]]
    return {
        "queue": queue,
        "listening": listening,
        "others": [w for w in alive if w not in listening],
    }


def job_context(run: Run, open_log: bool = True) -> dict:
    return {
        "run": run,
        "queue": queue_info(run),
        "checkpoint": checkpoint_state(run),
        "produces_model": RUN_KINDS[run.kind].produces_model,
        "open_log": open_log,
        "summary_json": json.dumps(run.summary, indent=2, sort_keys=True, default=str)
        if run.summary
        else "",
    }


@require_safe
def detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(request, run_id, related=("environment", "parent", "owner"))
    children = list(run.children.live().order_by("id"))
    return render(
        request,
        "jobs/detail.html",
        {
            **job_context(run),
            # Runs chained behind this one: those still waiting, and those already started or
            # finished from its output (a finished child is not "queued behind" anything).
            "children": [c for c in children if c.status == Run.Status.QUEUED],
            "started_children": [c for c in children if c.status != Run.Status.QUEUED],
            "config_json": json.dumps(run.config or {}, indent=2, sort_keys=True, default=str),
        },
    )


@require_safe
def progress(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(request, run_id, related=())
    finished = run.is_finished and request.headers.get("HX-Request")
    # 286: htmx swaps this last fragment and stops polling; the event lets the page refresh what
    # the end changed.
    response = render(
        request,
        "jobs/_progress.html",
        job_context(run, open_log=request.GET.get("log") == "open"),
        status=286 if finished else 200,
    )
    if finished:
        response["HX-Trigger"] = "run-finished"
    return response


@require_POST
def cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(request, run_id, "trainer", related=())
    if run.is_finished:
        messages.info(request, f"Run {run.id} already {run.status}.")
    else:
        run.request_cancel()
        if run.is_finished:
            messages.success(request, f"Run {run.id} cancelled before it started.")
        else:
            messages.success(
                request, f"Cancelling run {run.id}: its worker stops the job at the next check."
            )
    return redirect("jobs-detail", run_id=run.id)


@require_safe
def workers(request: HttpRequest) -> HttpResponse:
    from django.conf import settings

    beats = WorkerHeartbeat.objects.select_related("current_run").order_by("-last_seen")[:50]
    max_age = settings.WORKER_HEARTBEAT_SECONDS * 3
    return render(
        request, "jobs/_workers.html", {"workers": [(w, w.is_alive(max_age)) for w in beats]}
    )


@require_safe
def compare(request: HttpRequest) -> HttpResponse:
    try:
        ids = [int(x) for x in request.GET.getlist("run") if x]
    except ValueError:
        return render(request, "jobs/compare.html", {"error": "run: must be run ids"}, status=400)
    runs = list(Run.objects.live().filter(id__in=ids).select_related("environment"))
    runs.sort(
        key=lambda r: ids.index(r.id)
    )  # the order asked for: before / after reads left to right
    evals = eval_summary([r for r in runs if r.kind == Run.Kind.EVAL])
    # Evals are one step each: their table and bars say it all; per-step curves of one dot per
    # run do not.
    curves = [r for r in runs if r.kind != Run.Kind.EVAL]
    figures = compare_figures(curves) if curves else []
    return render(
        request,
        "jobs/compare.html",
        {
            "runs": runs,
            "all_runs": Run.objects.live()
            .select_related("environment")
            .order_by("-created_at")[:200],
            "selected": ids,
            "figures": figures,
            "evals": evals,
            "weights": weights_differ(curves),
        },
    )


def eval_summary(runs: list[Run]) -> dict | None:
    """Held-out evals side by side: one row per eval run (rollouts, reward mean, each component's
    mean over its rollouts) and a grouped bar chart of the component means. Single-step runs read
    badly as curves; this is what a before/after comparison of checkpoints wants."""
    if not runs:
        return None
    ids = [r.id for r in runs]
    totals = {
        g["run"]: g
        for g in RolloutGroup.objects.filter(run_id__in=ids)
        .values("run")
        .annotate(
            groups=Count("id"), rollouts=Sum("size"), weighted=Sum(F("reward_mean") * F("size"))
        )
    }
    means: dict[int, dict[str, float | None]] = {i: {} for i in ids}
    names: list[str] = []
    stats = (
        GroupComponentStat.objects.filter(run_id__in=ids)
        .values("run", "component__name")
        .annotate(weighted=Sum(F("mean") * F("count")), n=Sum("count"))
        .order_by("component__name")
    )
    for s in stats:
        if s["component__name"] not in names:
            names.append(s["component__name"])
        means[s["run"]][s["component__name"]] = (
            s["weighted"] / s["n"] if s["n"] and s["weighted"] is not None else None
        )
    rows = []
    for run in runs:
        t = totals.get(run.id) or {}
        reward = (
            t["weighted"] / t["rollouts"]
            if t.get("rollouts") and t.get("weighted") is not None
            else None
        )
        rows.append(
            {
                "run": run,
                "groups": t.get("groups", 0),
                "rollouts": t.get("rollouts") or 0,
                "reward": reward,
                "means": [means[run.id].get(n) for n in names],
            }
        )
    figure = {
        "data": [
            {
                "type": "bar",
                "name": f"{r['run'].id} {r['run'].name}"[:40],
                "x": names,
                "y": r["means"],
            }
            for r in rows
        ],
        "layout": {
            "title": {"text": "held-out component means"},
            "barmode": "group",
            "height": 320,
            "margin": {"t": 40, "r": 10},
        },
    }
    return {
        "names": names,
        "rows": rows,
        "figure": escape_figure(figure),
    }  # run and component names


def legend_name(run: Run, limit: int = 48) -> str:
    """A run as a legend entry: its name (cut to `limit`) and id; a bare id says nothing."""
    name = run.name if len(run.name) <= limit else run.name[: limit - 1] + "…"
    return f"{name} (#{run.id})"


LEGEND_BELOW = {"orientation": "h", "y": -0.25, "x": 0, "xanchor": "left", "yanchor": "top"}


@escaped
def compare_figures(runs: list[Run]) -> list[dict]:
    """Overlay per-step curves (the dashboard's, from StepStat): the aggregate reward mean and
    each component's mean."""
    reward = {
        "data": [],
        "layout": {
            "title": {"text": "reward mean per step"},
            "xaxis": {"title": {"text": "step"}},
            "height": 360,
            "margin": {"t": 40, "r": 10},
            "legend": LEGEND_BELOW,
        },
    }
    per_comp: dict[str, dict] = {}
    for run in runs:
        series = reward_series(run)[0]
        reward["data"].append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": legend_name(run),
                "x": series.steps,
                "y": series.mean,
            }
        )
        for cs in component_series(run, run.components()):
            if not cs.steps:
                continue
            fig = per_comp.setdefault(
                cs.name,
                {
                    "data": {},
                    "layout": {
                        "title": {"text": f"{cs.name} mean"},
                        "xaxis": {"title": {"text": "step"}},
                        "height": 320,
                        "margin": {"t": 40, "r": 10},
                        "legend": LEGEND_BELOW,
                    },
                },
            )
            fig["data"][run.id] = {
                "type": "scatter",
                "mode": "lines+markers",
                "name": legend_name(run),
                "x": cs.steps,
                "y": cs.mean,
            }
        if not series.steps:  # a run fed only metrics (e.g. SFT): its logged loss instead
            loss = (
                StepMetric.objects.filter(run=run, name="loss")
                .order_by("step")
                .values_list("step", "value")
            )
            reward["data"].append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": f"{legend_name(run)} loss",
                    "x": [s for s, _ in loss],
                    "y": [v for _, v in loss],
                }
            )
    return [reward] + [
        {"data": list(f["data"].values()), "layout": f["layout"]} for f in per_comp.values()
    ]
