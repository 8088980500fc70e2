"""REST API for behaviours. Wired in webapp/api/urls.py (api_urls.py here) at /api/v1/:

    GET  behaviours/?environment=<id>            -> {"behaviours": [...]} (any login)
    POST behaviours/  {"run" | "environment", "name", "query": {explorer params}, "pattern"?,
                       "critical"?, "max_rate"?, "description"?}
                                                 -> 201 the behaviour, with its preview on the run
                                                    (matches, warnings) (annotator role)
    GET  behaviours/<id>/                        -> the behaviour
    GET  behaviours/<id>/runs/<run_id>/          -> per step: rollouts, matches, rate, mean
                                                    advantage of matches and rest; onset; findings
    GET  behaviours/<id>/overlay/                -> the rate per step on every run of its env.
    GET  replays/<id>/behaviours/               -> per behaviour of the run's environment: the mean
                                                    advantage of its replayed rollouts, before/after
    POST runs/<run_id>/behaviours/propose/  {"label": slug} | {"rollouts": [ids]} (annotator)
                                                 -> find more like this: proposed queries, each with
                                                    matches, recall of the labelled, a sample

Errors follow the API's shape: {"errors": [{"field": "query.q", "error": "..."}]}.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.accounts.roles import require_role
from webapp.api.parsing import parse_body
from webapp.behaviours import charts, likeness, services
from webapp.behaviours.models import Behaviour
from webapp.errors import FieldError
from webapp.rollouts.models import Environment
from webapp.runs.access import get_run_for

BODY_KEYS = {
    "run",
    "environment",
    "name",
    "query",
    "pattern",
    "critical",
    "max_rate",
    "description",
}


def behaviour_json(b: Behaviour) -> dict[str, Any]:
    return {
        "id": b.id,
        "environment": b.environment_id,
        "name": b.name,
        "description": b.description,
        "query": b.query,
        "pattern": b.pattern,
        "critical": b.critical,
        "max_rate": b.max_rate,
        "version": b.version,
        "created_at": b.created_at.isoformat(),
    }


@extend_schema(
    summary="List behaviours, or save one (a named explorer query)",
    request={"application/json": {"type": "object"}},
    responses={200: dict, 201: dict, 400: dict},
)
@api_view(["GET", "POST"])
def behaviours(request: Request) -> Response:
    if request.method == "GET":
        require_role(request, "viewer")
        qs = Behaviour.objects.all()
        env = request.query_params.get("environment")
        if env:
            if not env.isdigit():
                raise FieldError("environment", "must be an environment id")
            qs = qs.filter(environment_id=int(env))
        return Response({"behaviours": [behaviour_json(b) for b in qs[:500]]})
    require_role(request, "annotator")
    body = parse_body(request)
    env, run = _target(request, body)
    b = services.define(
        env,
        name=body.get("name") or "",
        query=body.get("query"),
        pattern=_str(body, "pattern", 500),
        description=_str(body, "description", 5000),
        critical=_bool(body, "critical"),
        max_rate=_rate(body),
        user=request.user,
    )
    out = behaviour_json(b)
    out["preview"] = services.preview(b, run)
    return Response(out, status=status.HTTP_201_CREATED)


def _target(request: Request, body: Any) -> tuple[Environment, Any]:
    if not isinstance(body, dict):
        raise FieldError("body", "must be a JSON object with name, query and run or environment")
    extra = sorted(set(body) - BODY_KEYS)
    if extra:
        raise FieldError(extra[0], f"unknown key; expected {', '.join(sorted(BODY_KEYS))}")
    if body.get("run") is not None:
        if not isinstance(body["run"], int):
            raise FieldError("run", "must be a run id")
        run = get_run_for(request, body["run"])
        if run.environment_id is None:
            raise FieldError("run", "has no environment: a behaviour belongs to one")
        return run.environment, run
    env_id = body.get("environment")
    if not isinstance(env_id, int):
        raise FieldError("environment", "give a run id (run) or an environment id (environment)")
    env = Environment.objects.filter(id=env_id).first()
    if env is None:
        raise FieldError("environment", f"no environment {env_id}")
    return env, None


def _str(body: dict, key: str, limit: int) -> str:
    v = body.get(key) or ""
    if not isinstance(v, str) or len(v) > limit:
        raise FieldError(key, f"must be a string of at most {limit} characters")
    return v


def _bool(body: dict, key: str) -> bool:
    v = body.get(key, False)
    if not isinstance(v, bool):
        raise FieldError(key, "must be true or false")
    return v


def _rate(body: dict) -> float | None:
    v = body.get("max_rate")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise FieldError("max_rate", "must be a fraction from 0 to 1")
    return float(v)


@extend_schema(
    summary="A behaviour", operation_id="behaviour_retrieve", responses={200: dict, 404: dict}
)
@api_view(["GET"])
def behaviour_detail(request: Request, behaviour_id: int) -> Response:
    require_role(request, "viewer")
    return Response(behaviour_json(get_object_or_404(Behaviour, id=behaviour_id)))


@extend_schema(
    summary="A behaviour on a run: per-step rate and advantages, onset, findings",
    responses={200: dict, 400: dict, 404: dict},
)
@api_view(["GET"])
def behaviour_run(request: Request, behaviour_id: int, run_id: int) -> Response:
    b = get_object_or_404(Behaviour, id=behaviour_id)
    run = get_run_for(request, run_id)
    if run.environment_id != b.environment_id:
        raise FieldError("run", f"run {run.id} is not a run of the behaviour's environment")
    return Response(charts.run_document(b, run))


@extend_schema(summary="A behaviour's rate on every run of its environment", responses={200: dict})
@api_view(["GET"])
def behaviour_overlay(request: Request, behaviour_id: int) -> Response:
    require_role(request, "viewer")
    b = get_object_or_404(Behaviour, id=behaviour_id)
    runs = list(services.runs_of(b)[:50])
    doc = {"behaviour": behaviour_json(b), "runs": services.overlay(b, runs)}
    if not runs:
        doc["note"] = services.NO_RUNS.format(env=b.environment.name)
    return Response(doc)


@extend_schema(
    summary="Find more like this: queries describing labelled rollouts of a run",
    request={"application/json": {"type": "object"}},
    responses={200: dict, 400: dict},
)
@api_view(["POST"])
def propose(request: Request, run_id: int) -> Response:
    run = get_run_for(request, run_id, "annotator")  # the first step of saving a behaviour
    body = parse_body(request)
    if not isinstance(body, dict) or set(body) - {"label", "rollouts"}:
        raise FieldError("body", "must be a JSON object with label or rollouts")
    ids = body.get("rollouts")
    if ids is not None and (
        not isinstance(ids, list) or not all(isinstance(i, int) and i > 0 for i in ids)
    ):
        raise FieldError("rollouts", "must be a list of rollout ids")
    label = body.get("label")
    if label is not None and not isinstance(label, str):
        raise FieldError("label", "must be a label slug")
    return Response(likeness.propose(run, likeness.labelled_ids(run, label, ids)))


@extend_schema(
    summary="How a reward replay changes the advantages of each behaviour's rollouts",
    responses={200: dict, 404: dict},
)
@api_view(["GET"])
def replay_effects(request: Request, replay_id: int) -> Response:
    from webapp.behaviours.replays import effects
    from webapp.replays.models import Replay

    replay = get_object_or_404(Replay.objects.select_related("run"), id=replay_id)
    get_run_for(request, replay.run_id)
    return Response({"replay": replay.id, "behaviours": effects(replay)})
