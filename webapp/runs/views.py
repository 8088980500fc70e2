"""Run pages: the list and the dashboard. Read-only: every role from viewer up sees them."""

from __future__ import annotations

import json

import orjson
from django.core.cache import cache
from django.db.models import Count, Max, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_safe

from training.jobs import JOBS, RUN_KINDS
from webapp.accounts.roles import require_role
from webapp.rollouts.models import StepStat
from webapp.runs import charts, results
from webapp.runs.access import get_run_for
from webapp.runs.job_views import queue_info
from webapp.runs.models import Run, StepMetric
from webapp.runs.queries import dashboard_data, run_summaries
from webapp.runs.services import reap_stale_runs

RUNS_PER_PAGE = 200
LAUNCH_KINDS = [(kind, job.title) for kind, job in JOBS.items()]
DIAG_SLOT_KEY = "diag-slot:{}"  # webapp.diagnostics.services.slot_summary's cache key


def _choice(
    request: HttpRequest, name: str, choices: list[tuple[str, str]]
) -> tuple[str, str | None]:
    """(value, error) for an optional filter; an unknown value is an error naming the parameter."""
    value = request.GET.get(name, "")
    if value and value not in {c for c, _ in choices}:
        return "", f"{name}: must be one of {', '.join(c for c, _ in choices)}"
    return value, None


@require_safe
def runs_list(request: HttpRequest) -> HttpResponse:
    require_role(request, "viewer")
    reap_stale_runs()  # a run whose worker died shows as failed, not running forever (one UPDATE)
    kind, kind_error = _choice(request, "kind", Run.Kind.choices)
    status, status_error = _choice(request, "status", Run.Status.choices)
    runs = Run.objects.live().select_related("environment").order_by("-created_at")
    if kind:
        runs = runs.filter(kind=kind)
    if status:
        runs = runs.filter(status=status)
    runs = list(runs[:RUNS_PER_PAGE])
    summaries = run_summaries([r.id for r in runs])  # one query for every row's counts and curve
    for r in (
        runs
    ):  # SFT/DPO store no groups: their steps are the trainer's (progress), not StepStat rows
        summaries[r.id].steps = max(summaries[r.id].steps, r.current_step or 0)
    errors = [e for e in (kind_error, status_error) if e]
    ctx = {
        "blocks": list_blocks(runs, summaries),
        "kinds": Run.Kind.choices,
        "statuses": Run.Status.choices,
        "kind": kind,
        "status": status,
        "errors": errors,
        "launch_kinds": LAUNCH_KINDS,
        "any_live": any(r.status == Run.Status.RUNNING and r.kind != Run.Kind.IMPORT for r in runs),
    }
    return render(request, "runs/list.html", ctx, status=400 if errors else 200)


def list_blocks(runs: list[Run], summaries: dict) -> list[dict]:
    """The runs list's rows, a chain's runs together (teacher -> SFT -> eval -> GRPO -> eval, its
    learning story on a header row) where its newest run stands; other runs alone, newest first.
    Each row: (run, summary, sparkline, headline: an eval's held-out reward, a teacher's kept)."""
    chain_list = results.chains(runs)
    heads = results.list_headlines(chain_list)
    order = {r.id: i for i, r in enumerate(runs)}
    blocks = []
    for c in sorted(chain_list, key=lambda c: min(order[r.id] for r in c.runs)):
        rows = [
            (r, summaries[r.id], charts.sparkline_points(summaries[r.id].curve), heads.get(r.id))
            for r in c.runs
        ]
        blocks.append(
            {"chain": c if len(c.runs) > 1 else None, "story": results.story(c), "rows": rows}
        )
    return blocks


def refresh_diagnostics_on_status_change(run: Run) -> None:
    """The diagnostics slot is cached for a minute; a run that just ended must not show
    its live verdict."""
    seen_key = f"diag-slot-status:{run.id}"
    if cache.get(seen_key) != run.status:
        cache.delete(DIAG_SLOT_KEY.format(run.id))
        cache.set(seen_key, run.status, None)


@require_safe
def run_dashboard(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(request, run_id, related=("environment", "parent", "owner"))
    refresh_diagnostics_on_status_change(run)
    data = dashboard_data(run)
    figures = charts.dashboard_figures(data)
    components = run.components()
    logged_hashes = (run.provenance or {}).get("components") or {}
    # The weight this run trained with (trainer-reported or launch-time), beside
    # the environment's default.
    weights = run.reward_weights(components)
    provenance = [(c, logged_hashes.get(c.name, ""), weights.get(c.name)) for c in components]
    kind = RUN_KINDS[run.kind]
    ctx = {
        "run": run,
        "data": data,
        "figures": figures,
        "figures_json": json_script(figures["all"], "dashboard-figures"),
        "provenance": provenance,
        "git_commit": (run.provenance or {}).get("git_commit", ""),
        "config_json": json.dumps(
            {**(run.config or {}), "reward_settings": run.reward_settings or {}},
            indent=2,
            sort_keys=True,
        ),
        "summary_json": json.dumps(run.summary, indent=2, sort_keys=True, default=str)
        if run.summary
        else "",
        "explanation": charts.BATCH_VS_GROUP,
        "has_rollouts_kind": kind.records_rollouts,
        "trains_on_data": kind.produces_model and not kind.records_rollouts,  # a dataset
        "no_verdict": kind.no_verdict,
        "live_version": "" if run.is_finished else live_version(run),  # only a live page polls
        # An eval's or a teacher's answer is a table, not per-step charts of one dot each.
        "one_step_results": kind.one_step and len(data.reward.steps) <= 1,
        "eval_results": results.eval_results(run)
        if run.kind == Run.Kind.EVAL and data.n_rollouts
        else None,
        "teacher_result": results.teacher_result(run) if run.kind == Run.Kind.TEACHER else None,
        "queue": queue_info(run),
    }
    return render(request, "runs/dashboard.html", ctx)


JSON_SCRIPT_ESCAPES = {ord(">"): "\\u003E", ord("<"): "\\u003C", ord("&"): "\\u0026"}


def json_script(value: object, element_id: str) -> SafeString:
    """Django's json_script (same escaping: no "</script>" can end the element), encoded by orjson:
    the figures of a 500-step dashboard (230 KB) took ~30 ms through json.dumps. json for what
    orjson refuses (a lone surrogate in a model-chosen metric name)."""
    try:
        text = orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, TypeError):
        text = json.dumps(value)
    return format_html(
        '<script id="{}" type="application/json">{}</script>',
        element_id,
        mark_safe(text.translate(JSON_SCRIPT_ESCAPES)),
    )


def live_state(run: Run) -> tuple[str, int, int]:
    """(version, groups, rollouts): the version changes whenever the run gains a step of rollouts
    or a logged metric (two aggregates); the counts are the header's."""
    stats = StepStat.objects.filter(run=run, component_id=0).aggregate(
        n=Count("id"), g=Sum("n_groups"), r=Sum("n_rollouts")
    )
    metrics = StepMetric.objects.filter(run=run).aggregate(n=Count("id"), last=Max("step"))
    version = f"{stats['n']}.{stats['g']}.{metrics['n']}.{metrics['last']}"
    return version, stats["g"] or 0, stats["r"] or 0


def live_version(run: Run) -> str:
    return live_state(run)[0]


@require_safe
def run_live(request: HttpRequest, run_id: int) -> JsonResponse:
    """The dashboard's poll while a run is live: its status and, only when something new was
    stored since the version the page holds, the charts' points from step `since` on (the page
    holds every step before it) -- or every chart's whole figure when the page names no step (a
    chart it lacks)."""
    run = get_run_for(request, run_id, related=())
    version, n_groups, n_rollouts = live_state(run)
    body: dict = {
        "status": run.status,
        # The title's badge: "cancelling" between the request and the worker stopping the job.
        "badge": "cancelling" if run.cancel_requested and not run.is_finished else run.status,
        "n_groups": n_groups,
        "n_rollouts": n_rollouts,
        "finished": run.is_finished,
        "version": version,
        "step": run.current_step,
        "progress": run.progress,
        "figures": None,
        "points": None,
    }
    if version != request.GET.get("version"):
        since = _since(request)
        if since is None:
            body["figures"] = charts.dashboard_figures(dashboard_data(run))["all"]
        else:
            body["points"] = charts.live_points(dashboard_data(run, since=since))
            body["since"] = since
    return JsonResponse(body)


def _since(request: HttpRequest) -> int | None:
    try:
        return max(int(request.GET["since"]), 0)
    except (KeyError, ValueError):
        return None
