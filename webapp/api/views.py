"""REST API v1: create runs, ingest groups and metrics, query rollouts and groups.

Writes need the trainer role (or ownership of the run); reads need any login. Auth: `Token <key>`.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.decorators import api_view
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.accounts.roles import has_role
from webapp.api.parsing import parse_body
from webapp.errors import Conflict, FieldError
from webapp.explorer.params import ExplorerQuery
from webapp.explorer.query import explore_values
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Group, GroupComponentStat, RewardComponent, RewardScore
from webapp.rollouts.services import (
    create_run,
    ensure_environment,
    get_or_create_run,
    validate_environment_spec,
)
from webapp.runs import reward_settings
from webapp.runs.access import get_run_for
from webapp.runs.metrics import record_metrics
from webapp.runs.models import Run


def _can_write(request: Request, run: Run | None = None) -> bool:
    """Trainers write to any run; a run's owner to their own while they keep at least the annotator
    role (a viewer changes nothing, owner or not). Roles are read on every request, token or
    session alike (the token's user row is loaded afresh per request), so a demotion takes effect
    on the next call."""
    if has_role(request.user, "trainer"):
        return True
    return (
        run is not None and run.owner_id == request.user.id and has_role(request.user, "annotator")
    )


def _require_write(request: Request, run: Run | None = None) -> None:
    if not _can_write(
        request, run
    ):  # the handler answers {"errors": [{"field": "", "error": ...}]}, 403
        raise PermissionDenied("this needs the trainer role or ownership of the run")


def _run_json(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "name": run.name,
        "kind": run.kind,
        "status": run.status,
        "environment": run.environment.name if run.environment_id else None,
        "base_model": run.base_model,
        "created_at": run.created_at.isoformat(),
        "progress": run.progress,
        "current_step": run.current_step,
        "reward_settings": run.reward_settings or {},
    }


@extend_schema(
    summary="List runs, or create one with its environment and reward components",
    request={"application/json": {"type": "object"}},
    responses={200: dict, 201: dict},
)
@api_view(["GET", "POST"])
def runs(request: Request) -> Response:
    if request.method == "GET":
        qs = Run.objects.live().select_related("environment").order_by("-created_at")
        name = request.query_params.get("name")
        if name is not None:  # exact name, any age: the client's find_run
            qs = qs.filter(name=name.strip())
        return Response({"runs": [_run_json(r) for r in qs[:500]]})
    _require_write(request)
    body = _run_body(parse_body(request))
    env_name, comps = validate_environment_spec(body.get("environment"))
    settings = _creation_settings(body, env_name, comps)
    env = ensure_environment(env_name, comps)
    fields = dict(
        name=body["name"].strip(),
        kind=body.get("kind", "import"),
        environment=env,
        config=body.get("config", {}),
        owner=request.user,
        base_model=body.get("base_model", ""),
    )
    if body.get("get_or_create"):
        run, created = _get_or_create(request, fields)
    else:
        run, created = create_run(**fields, status=Run.Status.RUNNING), True
    if settings and created:  # over what the config's reward_weights said, if anything
        own = run.reward_settings or {}
        weights = {**(own.get("weights") or {}), **(settings.get("weights") or {})}
        run.reward_settings = {**own, **settings, **({"weights": weights} if weights else {})}
        run.save(update_fields=["reward_settings"])
    return Response(
        {"id": run.id, "created": created},
        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
    )


RUN_FIELDS = {
    "name": str,
    "kind": str,
    "config": dict,
    "environment": dict,
    "base_model": str,
    "reward_settings": dict,
    "get_or_create": bool,
}
_TYPE_NAMES = {str: "a string", dict: "an object", bool: "true or false"}


def _run_body(body: Any) -> dict[str, Any]:
    """The create-run body, checked key by key: unknown keys and wrong types are refused by name."""
    if not isinstance(body, dict):
        raise FieldError("body", "must be a JSON object")
    for key, value in body.items():
        if key not in RUN_FIELDS:
            raise FieldError(
                str(key)[:100] or '""', f"unknown field; expected {', '.join(RUN_FIELDS)}"
            )
        if not isinstance(value, RUN_FIELDS[key]):
            raise FieldError(key, f"must be {_TYPE_NAMES[RUN_FIELDS[key]]}")
    name = body.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise FieldError("name", "must be a non-empty string of at most 200 characters")
    if body.get("kind", "import") not in Run.Kind.values:
        raise FieldError("kind", f"must be one of {', '.join(Run.Kind.values)}")
    if len(body.get("base_model", "")) > 500:
        raise FieldError("base_model", "must be at most 500 characters")
    return body


def _get_or_create(request: Request, fields: dict[str, Any]) -> tuple[Run, bool]:
    """`"get_or_create": true`: the run with this name if there is one, else a new one. Safe to
    retry and to race: every caller naming one run gets the same run
    (rollouts.services.get_or_create_run, whose RunNameConflict is a 409)."""
    run, created = get_or_create_run(**fields)
    if created:
        return run, True
    if run.environment_id != fields["environment"].id:
        used = run.environment.name if run.environment_id else None
        raise Conflict("environment", f"run {run.id} named {run.name!r} uses environment {used!r}")
    _require_write(request, run)
    return run, False


def _creation_settings(
    body: dict[str, Any], env_name: str, comps: list[dict[str, Any]]
) -> dict[str, Any]:
    """The new run's reward settings: `reward_settings` from the body, and the weights
    its components name explicitly. They are this run's, even when the environment exists
    with other weights."""
    raw = body.get("reward_settings") or {}
    names = {c["name"] for c in comps} | set(
        RewardComponent.objects.filter(environment__name=env_name).values_list("name", flat=True)
    )
    settings = reward_settings.validate(raw, sorted(names))
    given = body["environment"].get("components") or []
    explicit = {c["name"]: float(c["weight"]) for c in given if "weight" in c}  # validated above
    if explicit:
        settings["weights"] = {**explicit, **settings.get("weights", {})}
    return {**settings, "source": "created"} if settings else {}


@extend_schema(
    summary="Store the reward settings a trainer trained with (they win over the run's)",
    request={"application/json": {"type": "object"}},
    responses={200: dict, 400: dict},
)
@api_view(["POST"])
def run_settings(request: Request, run_id: int) -> Response:
    run = get_run_for(request, run_id, "trainer", owner_may=True, related=())
    names = [c.name for c in run.components()]
    settings = reward_settings.validate(parse_body(request), names, path="reward_settings")
    with transaction.atomic():  # first_wins: two processes posting at once must not both win
        run = Run.objects.select_for_update().get(id=run.id)
        changed = reward_settings.apply(run, settings, settings.get("source") or "trainer")
    return Response({"reward_settings": run.reward_settings, "changed": changed})


@extend_schema(
    summary="Ingest a batch of groups (all or nothing, idempotent on step + key), or read a group",
    parameters=[OpenApiParameter("step", int), OpenApiParameter("key", str)],
    request={"application/json": {"type": "object"}},
    responses={200: dict, 201: dict, 400: dict},
)
@api_view(["GET", "POST"])
def run_groups(request: Request, run_id: int) -> Response:
    run = get_run_for(
        request,
        run_id,
        "trainer" if request.method == "POST" else "viewer",
        owner_may=True,
        related=(),
    )
    if request.method == "GET":
        return _group_detail(request, run)
    result = ingest_groups(run, parse_body(request))
    return Response(
        {
            "groups": result.groups,
            "rollouts": result.rollouts,
            "skipped_groups": result.skipped_groups,
        },
        status=status.HTTP_201_CREATED if result.groups else status.HTTP_200_OK,
    )


def _group_detail(request: Request, run: Run) -> Response:
    step, key = request.query_params.get("step"), request.query_params.get("key")
    if step is None or key is None:
        raise FieldError("step" if step is None else "key", "is required")
    try:
        group = get_object_or_404(Group, run=run, step=int(step), key=key)
    except ValueError:
        raise FieldError("step", "must be an integer") from None
    stats = {
        s.component.name: {
            "mean": s.mean,
            "std": s.std,
            "min": s.min,
            "max": s.max,
            "zero_std": s.zero_std,
        }
        for s in GroupComponentStat.objects.filter(group=group).select_related("component")
    }
    rollouts = list(group.rollouts.order_by("index"))
    scores: dict[int, dict[str, Any]] = {r.id: {} for r in rollouts}
    for rid, name, v, reason in RewardScore.objects.filter(rollout__group=group).values_list(
        "rollout_id", "component__name", "value", "reason"
    ):
        scores[rid][name] = {"value": v, "reason": reason}
    return Response(
        {
            "id": group.id,
            "step": group.step,
            "key": group.key,
            "prompt": group.prompt,
            "split": group.split,
            "size": group.size,
            "reward_mean": group.reward_mean,
            "reward_std": group.reward_std,
            "zero_std": group.zero_std,
            "components": stats,
            "rollouts": [
                {
                    "id": r.id,
                    "index": r.index,
                    "transcript": r.transcript,
                    "reward": r.reward,
                    "advantage": r.advantage,
                    "length": r.length,
                    "truncated": r.truncated,
                    "rewards": scores[r.id],
                }
                for r in rollouts
            ],
        }
    )


@extend_schema(
    summary="Record per-step trainer metrics",
    request={"application/json": {"type": "object"}},
    responses={200: dict, 400: dict},
)
@api_view(["POST"])
def run_metrics(request: Request, run_id: int) -> Response:
    run = get_run_for(request, run_id, "trainer", owner_may=True, related=())
    return Response({"metrics": record_metrics(run, parse_body(request))})


@extend_schema(summary="Mark an externally fed run finished", request=None, responses={200: dict})
@api_view(["POST"])
def run_finish(request: Request, run_id: int) -> Response:
    run = get_run_for(request, run_id, "trainer", owner_may=True)
    run.mark_succeeded()
    return Response(_run_json(run))


@extend_schema(
    summary="Rollouts of a run sorted by a component, the reward, the advantage or the length "
    "(keyset pages)",
    parameters=[
        OpenApiParameter(n, str)
        for n in (
            "sort",
            "order",
            "step_min",
            "step_max",
            "split",
            "limit",
            "cursor",
            "zero_std",
            "q",
        )
    ],
    responses={200: dict, 400: dict},
)
@api_view(["GET"])
def run_rollouts(request: Request, run_id: int) -> Response:
    # Only what the explorer reads of the run: not its config, provenance, summary or log.
    run = get_run_for(request, run_id, related=(), fields=("id", "environment", "owner"))
    components = run.components()
    q = ExplorerQuery.from_params(request.query_params, [c.name for c in components])
    rows, next_cursor = explore_values(run, q, components)
    return Response({"sort": q.sort, "order": q.order, "next": next_cursor, "rollouts": rows})
