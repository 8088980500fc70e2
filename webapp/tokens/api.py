"""REST API for tokens. Wired in webapp/api/urls.py (webapp/tokens/api_urls.py) at /api/v1/:

    GET /api/v1/rollouts/<rollout_id>/tokens/   -> {"rollout", "n", "fields", "arrays": {field:
                                                   [...]}, "summary": {...}}; 404 with
                                                   field "tokens" when none were recorded
    GET /api/v1/runs/<run_id>/token-stats/?since=N
                                                -> {"run", "steps": [TokenStepStat.as_dict()]}

Any login that may read the run (the viewer role); docs/api.md has the fields.
"""

from __future__ import annotations

from django.http import Http404, HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from webapp.errors import FieldError
from webapp.rollouts.models import Rollout
from webapp.runs.access import get_run_for
from webapp.tokens import services


class NoTokens(FieldError):
    status = 404


@extend_schema(summary="A rollout's token arrays", responses={200: dict, 404: dict})
@api_view(["GET"])
def rollout_tokens(request: Request, rollout_id: int) -> HttpResponse:
    run_id = Rollout.objects.filter(id=rollout_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise Http404("no such rollout")
    get_run_for(request, run_id, related=(), fields=("id", "owner"))
    body = services.rollout_tokens_json(rollout_id)
    if body is None:
        raise NoTokens("tokens", f"no tokens were recorded for rollout {rollout_id}")
    # The arrays serialised once by orjson, not through DRF's renderer (json.dumps of lists).
    return HttpResponse(body, content_type="application/json")


@extend_schema(
    summary="A run's per-step token statistics (sampler/trainer mismatch, entropy, masking)",
    parameters=[OpenApiParameter("since", int)],
    responses={200: dict, 400: dict},
)
@api_view(["GET"])
def run_token_stats(request: Request, run_id: int) -> Response:
    run = get_run_for(request, run_id, related=(), fields=("id", "owner"))
    since = request.query_params.get("since")
    try:
        after = int(since) if since not in (None, "") else None
    except ValueError:
        raise FieldError("since", "must be an integer step") from None
    return Response({"run": run.id, "steps": services.step_stats(run.id, after)})
