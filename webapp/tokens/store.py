"""The token view's and the dashboard's reads, through the data layer's one reader
(webapp/tokens/services.py), plus the transcript page's token count (one indexed row)."""

from __future__ import annotations

from typing import Any

from webapp.tokens import services
from webapp.tokens.codec import FIELDS
from webapp.tokens.models import RolloutTokens


def token_count(rollout_id: int) -> int | None:
    """The rollout's number of tokens, None when none were recorded (the blob is not read)."""
    return (
        RolloutTokens.objects.filter(rollout_id=rollout_id)
        .values_list("n_tokens", flat=True)
        .first()
    )


def read_tokens(rollout_id: int) -> dict[str, Any] | None:
    """The rollout's token arrays by field name (absent fields: None), or None."""
    data = services.rollout_tokens(rollout_id)
    if data is None:
        return None
    return {name: data["arrays"].get(name) for name in FIELDS}


def step_rows(run: Any, since: int | None = None) -> list[dict]:
    """The run's per-step token statistics (TokenStepStat.as_dict) from step `since` on."""
    return services.step_stats(run.id, None if since is None else since - 1)


def token_series(run: Any, since: int | None = None) -> dict[str, list] | None:
    """The dashboard's token series: "steps" and one list per statistic; None when the run has
    no tokens (from step `since` on: none there)."""
    rows = step_rows(run, since)
    if not rows:
        return None
    keys = [k for k in rows[0] if k != "step"]
    return {"steps": [r["step"] for r in rows], **{k: [r[k] for r in rows] for k in keys}}
