"""Behaviour pages: the list, one behaviour across the runs of its environment, the run dashboard's
panel (and its live JSON), "save this view as a behaviour" and "find more like this"."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from webapp.accounts.roles import has_role, require_role
from webapp.behaviours import charts, likeness, services
from webapp.behaviours.forms import BehaviourForm, LimitForm
from webapp.behaviours.models import PAGE_PARAMS, Behaviour
from webapp.errors import FieldError
from webapp.runs.access import get_run_for

MAX_OVERLAY_RUNS = 20


@require_safe
def behaviour_list(request: HttpRequest) -> HttpResponse:
    require_role(request, "viewer")
    qs = Behaviour.objects.select_related("environment").order_by("environment__name", "name")
    return render(request, "behaviours/list.html", {"behaviours": qs})


@require_safe
def behaviour_detail(request: HttpRequest, behaviour_id: int) -> HttpResponse:
    require_role(request, "viewer")
    b = get_object_or_404(Behaviour.objects.select_related("environment"), id=behaviour_id)
    runs = list(services.runs_of(b).order_by("-id")[:MAX_OVERLAY_RUNS])[::-1]
    rows = services.overlay(b, runs)
    figure = charts.overlay_figure(b.name, [r for r in rows if "error" not in r])
    ctx = {
        "b": b,
        "rows": rows,
        "figures": {"overlay": figure},
        "no_runs": services.NO_RUNS.format(env=b.environment.name) if not runs else "",
        "form": LimitForm(instance=b),
        "can_edit": has_role(request.user, "annotator"),
    }
    return render(request, "behaviours/detail.html", ctx)


@require_POST
def behaviour_limit(request: HttpRequest, behaviour_id: int) -> HttpResponse:
    require_role(request, "annotator")
    b = get_object_or_404(Behaviour, id=behaviour_id)
    form = LimitForm(request.POST, instance=b)
    if form.is_valid():
        form.save()
        messages.success(request, "Saved.")
    else:
        messages.error(request, "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
    return redirect("behaviours-detail", behaviour_id=b.id)


def _panel_docs(run: Any) -> list[dict[str, Any]]:
    return [charts.run_document(b, run) for b in services.behaviours_of(run)]


@require_safe
def run_panel(request: HttpRequest, run_id: int) -> HttpResponse:
    """The dashboard's behaviours section (loaded after the page): one chart per behaviour."""
    run = get_run_for(request, run_id)
    docs = _panel_docs(run)
    reward = charts.reward_series(run) if docs else {"steps": [], "mean": []}
    figures = {
        f"behaviour-{d['behaviour']}": charts.rate_figure(d, reward) for d in docs if d["steps"]
    }
    ctx = {"run": run, "docs": docs, "figures": figures, "live": not run.is_finished}
    return render(request, "behaviours/_run_panel.html", ctx)


@require_safe
def run_series(request: HttpRequest, run_id: int) -> JsonResponse:
    """The panel's figures, for a live dashboard's poll."""
    run = get_run_for(request, run_id)
    docs = _panel_docs(run)
    reward = charts.reward_series(run)
    return JsonResponse(
        {f"behaviour-{d['behaviour']}": charts.rate_figure(d, reward) for d in docs if d["steps"]}
    )


@require_http_methods(["GET", "POST"])
def behaviour_new(request: HttpRequest, run_id: int) -> HttpResponse:
    """Save an explorer view (its query string) as a behaviour of the run's environment."""
    require_role(request, "annotator")
    run = get_run_for(request, run_id)
    source = request.POST if request.method == "POST" else request.GET
    query = {k: v for k, v in source.items() if k not in PAGE_PARAMS and k in _query_keys(source)}
    form = BehaviourForm(request.POST or None)
    error = None
    if request.method == "POST" and form.is_valid():
        try:
            b = services.define(
                run.environment, query=query, user=request.user, **form.cleaned_data
            )
            messages.success(request, _saved_message(services.preview(b, run)))
            return redirect("behaviours-detail", behaviour_id=b.id)
        except FieldError as e:
            error = e
    ctx = {"run": run, "query": query, "query_qs": urlencode(query), "form": form, "error": error}
    return render(request, "behaviours/new.html", ctx, status=400 if error else 200)


FORM_FIELDS = {"name", "description", "pattern", "critical", "max_rate", "csrfmiddlewaretoken"}


def _query_keys(source: Any) -> set[str]:
    return {k for k in source if k not in FORM_FIELDS}


def _saved_message(preview: dict[str, Any]) -> str:
    text = f"Saved: it matches {preview['matches']} of {preview['rollouts']} rollouts"
    return text + (f" ({preview['warning']})." if preview["warning"] else ".")


@require_safe
def find_like(request: HttpRequest, run_id: int) -> HttpResponse:
    """Find more like this: queries describing the rollouts of the run with a label."""
    run = get_run_for(request, run_id)
    label = request.GET.get("label") or ""
    doc, error = None, None
    try:
        doc = likeness.propose(run, likeness.labelled_ids(run, label, None))
    except FieldError as e:
        error = e
    ctx = {"run": run, "label": label, "doc": doc, "error": error}
    return render(request, "behaviours/like.html", ctx, status=400 if error else 200)


@require_safe
def replay_effects(request: HttpRequest, replay_id: int) -> HttpResponse:
    """The replay page's section: each behaviour's replayed advantages, before and after."""
    from webapp.behaviours.replays import effects
    from webapp.replays.models import Replay

    replay = get_object_or_404(Replay.objects.select_related("run"), id=replay_id)
    get_run_for(request, replay.run_id)
    return render(request, "behaviours/_replay.html", {"rows": effects(replay)})
