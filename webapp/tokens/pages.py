"""The token view's endpoint and what the transcript page needs to offer it.

The transcript page asks one question of the token store (does this rollout have tokens, and how
many: one indexed row, no blob); the arrays are read only by `rollout_tokens`, the JSON the panel
fetches when it opens.
"""

from __future__ import annotations

from typing import Any

import orjson
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_safe

from webapp.accounts.roles import require_role
from webapp.rollouts.models import Rollout
from webapp.tokens import store
from webapp.tokens.charts import QUANTITIES
from webapp.tokens.tokenview import token_payload

OPEN_COOKIE = "tokens_open"  # set by static/js/tokens.js: the panel opens on the next page too
# The token scroller's height, fixed before the tokens arrive (nothing below it moves when they
# do): about TOKENS_PER_LINE tokens a 20 px line, between MIN_HEIGHT and MAX_HEIGHT pixels.
TOKENS_PER_LINE, LINE_PX, MIN_HEIGHT, MAX_HEIGHT = 14, 20, 100, 420


def scroller_height(n_tokens: int) -> int:
    lines = -(-n_tokens // TOKENS_PER_LINE) + 3  # turn headers and padding
    return max(MIN_HEIGHT, min(MAX_HEIGHT, lines * LINE_PX))


def transcript_context(request: HttpRequest, rollout: Rollout) -> dict[str, Any]:
    """The transcript page's token panel: the count (None: no tokens were recorded), whether the
    reader keeps it open, and the quantities it colours by."""
    count = store.token_count(rollout.id)
    return {
        "token_count": count,
        "tokens_height": scroller_height(count or 0),
        "tokens_open": request.COOKIES.get(OPEN_COOKIE) == "1",
        "token_quantities": [(key, label) for key, (label, _) in QUANTITIES.items()],
    }


@require_safe
def rollout_tokens(request: HttpRequest, rollout_id: int) -> HttpResponse:
    require_role(request, "viewer")
    rollout = get_object_or_404(
        Rollout.objects.only("id", "completion", "transcript"), id=rollout_id
    )
    arrays = store.read_tokens(rollout.id)
    if arrays is None:
        body = {"error": f"no tokens were recorded for rollout {rollout.id}"}
        return HttpResponse(orjson.dumps(body), status=404, content_type="application/json")
    payload = token_payload(arrays, rollout.completion, rollout.transcript)
    response = HttpResponse(orjson.dumps(payload), content_type="application/json")
    response["Cache-Control"] = "private, max-age=300"  # stored tokens never change
    return response
