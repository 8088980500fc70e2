"""Replay pages: a run's replays with the form to start one, a replay's comparison, its progress
fragment and cancel. Reading needs any role; starting and cancelling need trainer."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from webapp.accounts.roles import has_role, require_role
from webapp.errors import FieldError
from webapp.replays import charts, queue, results, selection
from webapp.replays.forms import ReplayForm
from webapp.replays.models import Replay
from webapp.replays.twin import launch_training, training_blocker
from webapp.rollouts.models import Rollout
from webapp.runs.access import get_run_for

PREVIEW_CHARS = 160


def _replay(request: HttpRequest, replay_id: int, role: str = "viewer") -> Replay:
    require_role(request, role)
    return get_object_or_404(
        Replay.objects.select_related("run", "run__environment", "created_by", "twin"), id=replay_id
    )


@require_http_methods(["GET", "POST"])
def run_replays(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(request, run_id, "trainer" if request.method == "POST" else "viewer")
    env = run.environment.name if run.environment_id else ""
    form = ReplayForm(request.POST or None, environment=env)
    if request.method == "POST" and form.is_valid():
        try:
            replay = selection.create_replay(run, form.request_body(), request.user)
        except FieldError as e:
            form.add_error(None, f"{e.field}: {e.message}")
        else:
            queue.enqueue(replay)
            return redirect("replays-detail", replay.id)
    ctx = {
        "run": run,
        "form": form,
        "can_start": has_role(request.user, "trainer"),
        "replays": list(run.replays.select_related("created_by")[:100]),
    }
    return render(request, "replays/run.html", ctx, status=400 if form.errors else 200)


def _previews(rows: list[dict]) -> list[dict]:
    ids = {r["rollout_id"] for r in rows}
    text = dict(Rollout.objects.filter(id__in=ids).values_list("id", "completion"))
    return [{**r, "preview": (text.get(r["rollout_id"]) or "")[:PREVIEW_CHARS]} for r in rows]


@require_safe
def replay_detail(request: HttpRequest, replay_id: int) -> HttpResponse:
    replay = _replay(request, replay_id)
    rep = results.report(replay) if replay.results is not None else None
    trainer = has_role(request.user, "trainer")
    # Not `can_train`: the base template's navigation reads that name (the Launch link).
    blocker = training_blocker(replay) if trainer and replay.twin_id is None else ""
    ctx = {
        "replay": replay,
        "run": replay.run,
        "report": rep,
        "can_cancel": trainer,
        "can_resume": trainer and queue.stalled(replay),
        "stale_minutes": queue.STALE_SECONDS // 60,
        "figures": charts.figures(rep) if rep else {},
        "offer_training": trainer and replay.twin_id is None and not blocker,
        "training_blocker": blocker if replay.is_finished else "",
        # The summary line and the box below it, both from the annotations as they are now.
        "summary_now": results.current_summary(replay, rep) if rep else "",
        "now": timezone.now(),
    }
    if rep:
        ctx["top_changes"] = _previews(rep["top_changes"])
        ctx["flips"] = _previews(rep["flips"])
        ctx["regression"] = _previews(rep["regression"])
        ctx["hists"] = [
            (f"hist-{i}", row) for i, row in enumerate(rep["components"]) if row["replayed"]
        ]
    return render(request, "replays/detail.html", ctx)


@require_safe
def replay_progress(request: HttpRequest, replay_id: int) -> HttpResponse:
    """The progress fragment a running replay's page polls; a finished replay reloads the page."""
    replay = _replay(request, replay_id)
    response = render(request, "replays/_progress.html", {"replay": replay})
    if replay.is_finished and request.GET.get("running"):
        response["HX-Refresh"] = "true"
    return response


@require_POST
def replay_cancel(request: HttpRequest, replay_id: int) -> HttpResponse:
    replay = _replay(request, replay_id, "trainer")
    replay.request_cancel()
    messages.info(request, "Cancel requested: the replay stops after the chunks in flight.")
    return redirect("replays-detail", replay.id)


@require_POST
def replay_train(request: HttpRequest, replay_id: int) -> HttpResponse:
    """ "Train with this reward": a GRPO twin of the run with the replayed versions, then the
    overlay."""
    replay = _replay(request, replay_id, "trainer")
    had_twin = replay.twin_id is not None
    try:
        twin = launch_training(replay, request.user)
    except FieldError as e:
        messages.error(request, f"Not started: {e.field}: {e.message}")
        return redirect("replays-detail", replay.id)
    if had_twin:
        messages.info(request, "This replay already has a twin run.")
    elif twin.config.get("start_after_parent"):
        messages.success(
            request, "The twin run is queued; it starts when the original run finishes."
        )
    else:
        messages.success(request, "The twin run is queued for a GPU worker.")
    return redirect("diagnostics-overlay", run_id=replay.run_id, other_id=twin.id)


@require_POST
def replay_resume(request: HttpRequest, replay_id: int) -> HttpResponse:
    """Queue a stalled replay again (its workers died): stale chunks and the
    summary are reclaimed."""
    replay = _replay(request, replay_id, "trainer")
    if queue.resume(replay):
        messages.success(
            request, "Resumed: a worker picks up the unfinished chunks and the summary."
        )
    else:
        messages.info(request, "Not stalled: workers are still on this replay, or it has finished.")
    return redirect("replays-detail", replay.id)
