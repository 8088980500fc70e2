"""REST API for replays. Wired in webapp/api/urls.py through webapp/replays/api_urls.py:

    POST /api/v1/runs/<run_id>/replays/   {"versions": [{"version", "params"?}], "selection"?,
                                           "name"?}
                                          -> 201 the replay, queued (trainer role)
    GET  /api/v1/runs/<run_id>/replays/   -> {"replays": [...]} (any login)
    GET  /api/v1/replays/<id>/            -> the replay: status, progress, summary, headline numbers
    GET  /api/v1/replays/<id>/regress/    -> {"ok", "headline", "regressions", "rows"};
                                             409 while running
    POST /api/v1/replays/<id>/train/      -> 201 {"twin", ...}: a GRPO twin trained with the
                                             replayed versions (200 with the existing twin; 400
                                             naming why not) (trainer role)

Errors follow the API's shape:
{"errors": [{"field": "versions[0].params.min_coverage", "error": "..."}]}.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.accounts.roles import require_role
from webapp.api.parsing import parse_body
from webapp.replays import queue, results, selection
from webapp.replays.models import Replay
from webapp.replays.twin import launch_training
from webapp.runs.access import get_run_for


def replay_json(r: Replay) -> dict[str, Any]:
    return {
        "id": r.id,
        "run": r.run_id,
        "name": r.name,
        "status": r.status,
        "versions": r.versions,
        "selection": r.selection,
        "total": r.total,
        "done": r.done,
        "failed": r.failed,
        "progress": round(r.progress, 4),
        "chunks": r.n_chunks,
        "summary": r.summary,
        "error": r.error,
        "run_was_live": r.run_was_live,
        "last_group_id": r.last_group_id,
        "headline": r.stats,
        "created_at": r.created_at.isoformat(),
        "finished_at": r.finished_at and r.finished_at.isoformat(),
    }


@extend_schema(
    summary="Start a reward replay of a run's stored transcripts; or list its replays",
    request={"application/json": {"type": "object"}},
    responses={200: dict, 201: dict, 400: dict},
)
@api_view(["GET", "POST"])
def run_replays(request: Request, run_id: int) -> Response:
    run = get_run_for(request, run_id, "trainer" if request.method == "POST" else "viewer")
    if request.method == "GET":
        return Response({"replays": [replay_json(r) for r in run.replays.all()[:200]]})
    replay = selection.create_replay(run, parse_body(request), request.user)
    queue.enqueue(replay)
    return Response(replay_json(replay), status=status.HTTP_201_CREATED)


@extend_schema(
    summary="A replay: status, progress, one-line summary and headline numbers",
    responses={200: dict},
)
@api_view(["GET"])
def replay_detail(request: Request, replay_id: int) -> Response:
    return Response(replay_json(get_object_or_404(Replay, id=replay_id)))


@extend_schema(
    summary="Annotated reward hacks that still outrank their group's median under the replayed "
    "reward",
    responses={200: dict, 409: dict},
)
@api_view(["GET"])
def replay_regress(request: Request, replay_id: int) -> Response:
    replay = get_object_or_404(Replay.objects.select_related("run"), id=replay_id)
    result = results.regress(replay)  # a Conflict (409) while the replay has no results
    return Response(
        {
            "ok": result.ok,
            "headline": result.headline,
            "regressions": sum(r["regression"] for r in result.rows),
            "rows": result.rows,
        }
    )


@extend_schema(
    summary="Train with this reward: a GRPO twin of the run with the replayed component versions",
    request=None,
    responses={200: dict, 201: dict, 400: dict, 403: dict},
)
@api_view(["POST"])
def replay_train(request: Request, replay_id: int) -> Response:
    require_role(request, "trainer")  # the role before the lookup, as get_run_for does
    replay = get_object_or_404(Replay.objects.select_related("run"), id=replay_id)
    had_twin = replay.twin_id is not None
    twin = launch_training(replay, request.user)
    body = {
        "twin": twin.id,
        "name": twin.name,
        "status": twin.status,
        "reward_versions": twin.config["reward_versions"],
        "waits_for_run": bool(twin.config.get("start_after_parent")),
        "overlay": reverse("diagnostics-overlay", args=[replay.run_id, twin.id]),
    }
    return Response(body, status=status.HTTP_200_OK if had_twin else status.HTTP_201_CREATED)
