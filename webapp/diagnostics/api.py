"""REST API for diagnostics and ablations. Wired in webapp/api/urls.py:

    GET  /api/v1/runs/<run_id>/diagnostics/?window=50|all
                                            -> component health, findings (code, severity,
                                               onset step, evidence, fix), per-step health
                                               (webapp/diagnostics/report.py)

    POST /api/v1/runs/<run_id>/ablations/   {"name"?: str,
                                             "spec": {drop, weights, scale_rewards, aggregation}}
                                            -> 201 {"id", "name", "spec", "results"} (trainer role)
    GET  /api/v1/runs/<run_id>/ablations/   -> {"ablations": [...]} (any login)
    GET  /api/v1/ablations/<ablation_id>/   -> {"id", "run", "name", "spec", "results", ...}

Errors follow the API's shape: {"errors": [{"field": "spec.weights.format", "error": "..."}]}.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from training.ablation import AblationSpec
from webapp.api.parsing import parse_body
from webapp.diagnostics import report, services
from webapp.diagnostics.models import Ablation
from webapp.errors import FieldError
from webapp.runs.access import get_run_for
from webapp.runs.models import Run


def _json(a: Ablation, results: bool = True) -> dict[str, Any]:
    out = {
        "id": a.id,
        "run": a.run_id,
        "name": a.name,
        "spec": a.spec,
        "created_at": a.created_at.isoformat(),
        "created_by": a.created_by.username if a.created_by_id else None,
        "twin_run": a.twin_id,
    }
    if results:
        out["results"] = a.results
    else:
        out["verdict"] = (a.results or {}).get("verdict")
    return out


@extend_schema(
    summary="Recompute a run's advantages with components dropped or re-weighted, and save it; or "
    "list",
    request={"application/json": {"type": "object"}},
    responses={200: dict, 201: dict, 400: dict},
)
@api_view(["GET", "POST"])
def run_ablations(request: Request, run_id: int) -> Response:
    run = get_run_for(request, run_id, "trainer" if request.method == "POST" else "viewer")
    if request.method == "GET":
        qs = Ablation.objects.filter(run=run).select_related("created_by")[:200]
        return Response({"ablations": [_json(a, results=False) for a in qs]})
    name, spec = _ablation_body(parse_body(request), run)
    results = services.run_ablation(run, spec)
    a = Ablation.objects.create(
        run=run,
        name=(name or "").strip() or services.default_name(spec, run),
        spec=spec.as_dict(),
        results=results,
        created_by=request.user,
    )
    return Response(_json(a), status=status.HTTP_201_CREATED)


def _ablation_body(body: Any, run: Run) -> tuple[str | None, AblationSpec]:
    if not isinstance(body, dict):
        raise FieldError("body", "must be a JSON object with spec (and optionally name)")
    extra = set(body) - {"name", "spec"}
    if extra:
        raise FieldError(sorted(extra)[0], "unknown key; expected name and spec")
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > 200):
        raise FieldError("name", "must be a string of at most 200 characters")
    if "spec" not in body:
        raise FieldError("spec", "is required")
    return name, services.parse_spec(body["spec"], run)


@extend_schema(summary="A saved ablation with its results", responses={200: dict, 404: dict})
@api_view(["GET"])
def ablation_detail(request: Request, ablation_id: int) -> Response:
    a = get_object_or_404(Ablation.objects.select_related("created_by"), id=ablation_id)
    return Response(_json(a))


class _Finding(serializers.Serializer):
    code = serializers.CharField(
        help_text="dead_component, saturation, unreachable_reward, trivial_outputs, "
        "ignores_prompt, signal_collapse, length_hacking, aggregation_collapse, ..."
    )
    severity = serializers.ChoiceField(choices=["critical", "warning", "info"])
    title = serializers.CharField()
    detail = serializers.CharField(help_text="the numbers behind it")
    fix = serializers.CharField(help_text="what to try")
    component = serializers.CharField(allow_null=True)
    onset_step = serializers.IntegerField(allow_null=True, help_text="the step from which it holds")
    onset_known = serializers.BooleanField(
        help_text="false: it held since onset_step or earlier (the steps before were not read)"
    )
    evidence = serializers.DictField()
    link = serializers.CharField(help_text="explorer: example transcripts, from the onset step on")


class _Component(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.CharField()
    weight = serializers.FloatField()
    zero_std_frac = serializers.FloatField(allow_null=True, help_text="groups where it is constant")
    at_max = serializers.FloatField(allow_null=True)
    at_min = serializers.FloatField(allow_null=True)
    share = serializers.FloatField(
        allow_null=True, help_text="share of the within-group advantage variance"
    )


class _Diagnosis(serializers.Serializer):
    run = serializers.IntegerField()
    window = serializers.IntegerField(allow_null=True, help_text="steps; null: the whole run")
    status = serializers.ChoiceField(choices=["healthy", "warning", "critical", "not_enough_data"])
    note = serializers.CharField(
        allow_null=True, help_text="e.g. 'not enough groups to judge: ...'"
    )
    components = _Component(many=True)
    findings = _Finding(many=True)
    over_time = serializers.DictField(help_text="per-step health of every component")


@extend_schema(
    summary="A run's diagnosis: component health, findings with their onset step, per-step health",
    parameters=[
        OpenApiParameter(
            "window", str, description=f"last N steps (default {services.DEFAULT_WINDOW}) or 'all'"
        )
    ],
    responses={200: _Diagnosis, 400: dict, 403: dict, 404: dict},
)
@api_view(["GET"])
def run_diagnostics(request: Request, run_id: int) -> Response:
    run = get_run_for(request, run_id)
    return Response(report.run_report(run, report.parse_window(request.query_params.get("window"))))
