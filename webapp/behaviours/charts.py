"""A behaviour's per-step document (the API's, the dashboard's live JSON) and its plotly figures:
the rate beside the run's reward, and the rate on every run of the environment. Figures follow
webapp/runs/charts.py's convention and are @escaped (behaviour and run names are user text)."""

from __future__ import annotations

import math
from typing import Any

from training import behaviours as tb
from webapp.behaviours import services
from webapp.behaviours.models import Behaviour
from webapp.diagnostics.charts import PALETTE, _layout
from webapp.figures import escaped, line_trace
from webapp.runs import queries as run_queries
from webapp.runs.models import Run

Figure = dict[str, Any]


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 5)


def run_document(b: Behaviour, run: Run) -> dict[str, Any]:
    """The behaviour on the run, per step, with its onset and findings (an `error` instead when
    it cannot be computed)."""
    doc: dict[str, Any] = {"behaviour": b.id, "name": b.name, "run": run.id}
    try:
        s = services.series(b, run)
    except services.BehaviourError as e:
        return {**doc, "error": str(e), "steps": []}
    adv_in, adv_out = s.mean_advantages()
    up = tb.onset(s, +1, tb.BehaviourThresholds())
    info = tb.BehaviourInfo(b.name, b.critical, b.max_rate)
    return {
        **doc,
        "steps": s.steps.tolist(),
        "rollouts": s.n.tolist(),
        "matches": s.k.tolist(),
        "rate": [_num(x) for x in s.rate],
        "advantage_matches": [_num(x) for x in adv_in],
        "advantage_rest": [_num(x) for x in adv_out],
        "onset_step": int(s.steps[up]) if up is not None else None,
        "findings": [f.as_dict() for f in tb.findings(info, s)],
        "explorer": services.explorer_link(b, run),  # + &step_min=S&step_max=S: one step's
    }


@escaped
def rate_figure(doc: dict[str, Any], reward: dict[str, list]) -> Figure:
    """The behaviour's rate per step (left axis) beside the run's mean reward (right axis), the
    onset marked."""
    title = f"{doc['name']}: share of rollouts"
    if doc.get("onset_step") is not None:
        title += f" (rising since step {doc['onset_step']})"
    data = [
        line_trace(doc["steps"], doc["rate"], "rate", PALETTE[1]),
        line_trace(
            reward["steps"], reward["mean"], "mean reward", "#9ca3af", yaxis="y2", hoverinfo="skip"
        ),
    ]
    layout = _layout(title, "share of rollouts")
    layout["yaxis"]["rangemode"] = "tozero"
    layout["yaxis2"] = {
        "overlaying": "y",
        "side": "right",
        "title": {"text": "reward"},
        "showgrid": False,
        "zeroline": False,
    }
    layout["margin"]["r"] = 48
    if doc.get("onset_step") is not None:
        layout["shapes"] = [_vline(doc["onset_step"])]
    return {"data": data, "layout": layout}


def _vline(step: int) -> dict[str, Any]:
    return {
        "type": "line",
        "x0": step,
        "x1": step,
        "yref": "paper",
        "y0": 0,
        "y1": 1,
        "line": {"color": PALETTE[1], "dash": "dot", "width": 1},
    }


@escaped
def advantage_figure(doc: dict[str, Any]) -> Figure:
    """Mean advantage per step of the behaviour's rollouts and of the rest."""
    data = [
        line_trace(doc["steps"], doc["advantage_matches"], "its rollouts", PALETTE[1]),
        line_trace(doc["steps"], doc["advantage_rest"], "the rest", PALETTE[0]),
    ]
    return {"data": data, "layout": _layout(f"{doc['name']}: mean advantage", "advantage")}


@escaped
def overlay_figure(name: str, runs: list[dict[str, Any]]) -> Figure:
    """The behaviour's rate per step on every run of its environment."""
    data = [
        line_trace(r["steps"], r["rate"], f"{r['name']} (run {r['run']})", PALETTE[i % 8])
        for i, r in enumerate(runs)
        if r.get("steps")
    ]
    layout = _layout(f"{name}: share of rollouts per step, every run", "share of rollouts")
    layout["height"] = 320
    return {"data": data, "layout": layout}


def reward_series(run: Run) -> dict[str, list]:
    reward, _, _, _ = run_queries.reward_series(run)
    return {"steps": list(reward.steps), "mean": list(reward.mean)}
