"""The token findings of a run's diagnosis window (math in training/token_diagnostics.py): read
from the stored per-step token statistics and the per-rollout count of tool-output tokens in the
loss, never from the token arrays."""

from __future__ import annotations

import numpy as np

from training import diagnostics as dg
from training import token_diagnostics as td
from webapp.errors import FieldError
from webapp.explorer.params import ExplorerQuery
from webapp.rollouts.models import Rollout
from webapp.runs.models import Run
from webapp.tokens import store
from webapp.tokens.models import RolloutTokens

MAX_TOOL_ROLLOUTS = 50_000  # rollouts with tool output read per window (two small columns each)


def tool_tokens(run: Run, step_min: int | None) -> td.ToolTokens:
    """Per rollout of the window with tool output (a tool call, or tool tokens in its loss): its
    step and how many tool-output tokens it trains on. Rollouts whose arrays cannot tell (no turn
    or no mask recorded: tool_unmasked NULL) are left out."""
    rows = RolloutTokens.objects.filter(run=run, tool_unmasked__isnull=False)
    if step_min is not None:
        rows = rows.filter(step__gte=step_min)
    with_calls = Rollout.objects.filter(run=run, n_tool_calls__gt=0)
    if step_min is not None:
        with_calls = with_calls.filter(step__gte=step_min)
    rows = rows.filter(rollout_id__in=with_calls.values("id")) | rows.filter(tool_unmasked__gt=0)
    got = list(
        rows.order_by("-step", "rollout_id").values_list("rollout_id", "step", "tool_unmasked")[
            :MAX_TOOL_ROLLOUTS
        ]
    )
    got.sort(key=lambda r: (r[1], r[0]))
    a = np.array(got, dtype=np.int64).reshape(-1, 3)
    return td.ToolTokens(a[:, 0], a[:, 1], a[:, 2], a[:, 2])


def token_findings(run: Run, step_min: int | None = None) -> list[dict]:
    """The token findings over steps >= step_min (the diagnosis window), as JSON."""
    ts = td.TokenSteps.from_rows(store.step_rows(run, since=step_min))
    if ts.size == 0:
        return []
    findings = [f.as_dict() for f in td.diagnose_tokens(ts, tool_tokens(run, step_min))]
    for f in findings:
        if not _explorer_sorts(f["sort"]):
            f["sort"] = None  # the link then opens the explorer at the onset, in its default order
    return findings


def _explorer_sorts(key: str | None) -> bool:
    """Whether the explorer sorts by `key` (the token summaries' sorts are the data layer's)."""
    try:
        ExplorerQuery.from_params({"sort": key}, [])
    except FieldError:
        return False
    return True


def with_token_findings(diagnosis: dict, findings: list[dict]) -> dict:
    """A diagnosis (Diagnosis.as_dict) with the token findings among its findings, worst first,
    and its status raised to the worst of them (a window too small to judge the rewards can still
    show a token finding: its tokens are judged on their own counts)."""
    if not findings:
        return diagnosis
    merged = sorted(
        [*diagnosis["findings"], *findings],
        key=lambda f: dg.SEVERITY_ORDER.get(f["severity"], 9),
    )
    severities = {f["severity"] for f in merged}
    status = diagnosis["status"]
    if status in ("healthy", "warning", "not_enough_data"):
        status = "critical" if "critical" in severities else "warning"
    return {**diagnosis, "findings": merged, "status": status}
