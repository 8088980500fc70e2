"""Run pages: the list and the dashboard. Read-only: every role from viewer up sees them."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_safe

from webapp.accounts.roles import require_role
from webapp.rollouts.models import RewardComponent
from webapp.runs import charts
from webapp.runs.models import Run
from webapp.runs.queries import dashboard_data, run_summaries
from webapp.runs.services import reap_stale_runs

RUNS_PER_PAGE = 200
LAUNCH_KINDS = [("teacher", "Teacher"), ("sft", "SFT"), ("grpo", "GRPO"), ("dpo", "DPO"), ("eval", "Eval"),
                ("probe", "Probe")]


def _choice(request: HttpRequest, name: str, choices: list[tuple[str, str]]) -> tuple[str, str | None]:
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
    runs = Run.objects.select_related("environment").order_by("-created_at")
    if kind:
        runs = runs.filter(kind=kind)
    if status:
        runs = runs.filter(status=status)
    runs = list(runs[:RUNS_PER_PAGE])
    summaries = run_summaries([r.id for r in runs])  # one query for every row's counts and curve
    rows = [(r, summaries[r.id], charts.sparkline_points(summaries[r.id].curve)) for r in runs]
    errors = [e for e in (kind_error, status_error) if e]
    ctx = {"rows": rows, "kinds": Run.Kind.choices, "statuses": Run.Status.choices, "kind": kind,
           "status": status, "errors": errors, "launch_kinds": LAUNCH_KINDS}
    return render(request, "runs/list.html", ctx, status=400 if errors else 200)


@require_safe
def run_dashboard(request: HttpRequest, run_id: int) -> HttpResponse:
    require_role(request, "viewer")
    run = get_object_or_404(Run.objects.select_related("environment", "parent", "owner"), id=run_id)
    data = dashboard_data(run)
    figures = charts.dashboard_figures(data)
    components = list(RewardComponent.objects.filter(environment_id=run.environment_id).order_by("position", "id"))
    weights = run.reward_weights(components)
    for c in components:
        c.weight = weights[c.name]  # shown, never saved: the weight this run trained with, not the default
    logged_hashes = (run.provenance or {}).get("components") or {}
    provenance = [(c, logged_hashes.get(c.name, "")) for c in components]
    ctx = {
        "run": run,
        "data": data,
        "figures": figures,
        "provenance": provenance,
        "git_commit": (run.provenance or {}).get("git_commit", ""),
        "config_json": json.dumps({**(run.config or {}), "reward_settings": run.reward_settings or {}}, indent=2,
                                  sort_keys=True),
        "explanation": charts.BATCH_VS_GROUP,
    }
    return render(request, "runs/dashboard.html", ctx)
