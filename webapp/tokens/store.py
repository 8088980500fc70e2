"""The token view's and the dashboard's reads of the token store (the data layer's models and
codec, webapp/tokens/models.py): one place to adapt when the storage changes."""

from __future__ import annotations

from typing import Any

from webapp.tokens.codec import FIELDS
from webapp.tokens.models import RolloutTokens, TokenStepStat


def token_count(rollout_id: int) -> int | None:
    """The rollout's number of tokens, None when none were recorded (one indexed row, the blob is
    not read)."""
    return (
        RolloutTokens.objects.filter(rollout_id=rollout_id)
        .values_list("n_tokens", flat=True)
        .first()
    )


def read_tokens(rollout_id: int) -> dict[str, Any] | None:
    """The rollout's token arrays by field name (absent fields: None), or None."""
    row = RolloutTokens.objects.filter(rollout_id=rollout_id).only("rollout_id", "data").first()
    if row is None:
        return None
    arrays = row.arrays()
    return {name: getattr(arrays, name) for name in FIELDS}


def step_rows(run: Any, since: int | None = None, until: int | None = None) -> list[dict]:
    """The run's per-step token statistics (TokenStepStat.as_dict), steps ascending."""
    rows = TokenStepStat.objects.filter(run=run)
    if since is not None:
        rows = rows.filter(step__gte=since)
    if until is not None:
        rows = rows.filter(step__lte=until)
    return [r.as_dict() for r in rows.order_by("step")]


def token_series(run: Any, since: int | None = None) -> dict[str, list] | None:
    """The dashboard's token series: "steps" and one list per statistic; None when the run has
    no tokens (from step `since` on: none there)."""
    rows = step_rows(run, since)
    if not rows:
        return None
    keys = [k for k in rows[0] if k != "step"]
    return {"steps": [r["step"] for r in rows], **{k: [r[k] for r in rows] for k in keys}}
