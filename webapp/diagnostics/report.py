"""The diagnosis of a run as one JSON document: what the API returns and the
`diagnose` command prints.

Shape (every float finite or null):
    {"run", "run_name", "window" (steps, or null: the whole run),
     "status" (healthy / warning / critical / not_enough_data),
     "note" (why it cannot be judged, or null), "steps": {"min", "max"}, "n_rollouts",
     "n_groups", "reward_zero_std_frac", "components": [component health],
     "inferred_kinds": {name: what},
     "findings": [{"code", "severity", "title", "detail", "fix", "component", "onset_step",
     "onset_known" (False: it held since onset_step or earlier), "evidence", "link"}],
     "over_time": {"steps", "components": {name: {zero_std_frac, at_max, at_min, share}},
     "reward_zero_std_frac"}}
"""

from __future__ import annotations

from typing import Any

from webapp.diagnostics import links, services
from webapp.errors import FieldError
from webapp.runs.models import Run

MAX_WINDOW = 100_000
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def parse_window(raw: str | None) -> int | None:
    """'all' -> None (the whole run), a whole number of steps 1..MAX_WINDOW, or the
    default when absent."""
    if raw in (None, ""):
        return services.DEFAULT_WINDOW
    if raw == "all":
        return None
    if raw.isdigit() and 1 <= int(raw) <= MAX_WINDOW:
        return int(raw)
    raise FieldError("window", f"must be 'all' or a whole number of steps from 1 to {MAX_WINDOW}")


def run_report(run: Run, window: int | None = services.DEFAULT_WINDOW) -> dict[str, Any]:
    d = services.diagnose_run(run, window)
    h = d["health"]
    findings = _with_behaviours(run, links.with_links(run.id, d["findings"]), h["step_min"])
    status = d.get("status", "healthy")
    if status != "not_enough_data" and any(f["severity"] == "critical" for f in findings):
        status = "critical"  # a critical behaviour past its rate
    return {
        "run": run.id,
        "run_name": run.name,
        "window": window,
        "status": status,
        "note": d.get("note"),
        "steps": {"min": h["step_min"], "max": h["step_max"]},
        "n_rollouts": h["n_rollouts"],
        "n_groups": h["n_groups"],
        "reward_zero_std_frac": h["reward_zero_std_frac"],
        "components": h["components"],
        "inferred_kinds": d.get("inferred_kinds") or {},
        "findings": findings,
        "over_time": d.get("over_time") or {},
    }


def _with_behaviours(run: Run, findings: list[dict], step_min: int | None) -> list[dict]:
    """The findings of the environment's behaviours (webapp/behaviours) over the same window, merged
    in severity order."""
    from webapp.behaviours.services import run_findings

    merged = findings + run_findings(run, step_min)
    return sorted(merged, key=lambda f: -SEVERITY_RANK.get(f["severity"], 0))


def fails(report: dict[str, Any], level: str | None) -> bool:
    """Whether the report has a finding at `level` or worse ("not enough data" never fails:
    no false alarm)."""
    if level is None:
        return False
    return any(
        SEVERITY_RANK.get(f["severity"], 0) >= SEVERITY_RANK[level] for f in report["findings"]
    )
