"""Figure details the browser screenshots showed wrong: legends over the step title, a
trainer-log trace with nothing in it, chart values that JSON cannot carry. Pure functions: no
database, no browser."""

from __future__ import annotations

import json
import math

from webapp.diagnostics import charts as dcharts
from webapp.runs import charts


def _series(label: str, logged: list) -> dict:
    return {
        "label": label,
        "steps": [0, 1],
        "reward_mean": [0.1, 0.2],
        "components": {"correct": [0.5, 0.6]},
        "logged_reward": logged,
    }


def test_it_draws_a_trainer_log_trace_only_for_a_run_that_logged_a_number():
    figs = dcharts.overlay_figures(
        [_series("original: a", [(0, 0.3), (1, 0.4)]), _series("twin: b", [(0, None), (1, None)])]
    )
    names = [t["name"] for t in figs["reward"]["data"]]
    assert names == ["original: a", "twin: b", "original: a (trainer log)"]


def test_it_puts_the_legend_under_the_step_title_in_room_made_for_it():
    fig = dcharts.overlay_figures([_series("original: a", []), _series("twin: b", [])])["reward"]
    layout = fig["layout"]
    assert layout["legend"]["yref"] == "container" and layout["legend"]["yanchor"] == "bottom"
    rows = dcharts.LEGEND_ROW * 2 + 8
    assert layout["margin"]["b"] == 36 + rows and layout["height"] == 260 + rows
    single = dcharts.overlay_figures([_series("only", [])])["reward"]["layout"]
    assert single["margin"]["b"] == 36  # one trace: plotly draws no legend, no room kept


def test_it_rounds_chart_values_to_five_digits_and_drops_what_json_cannot_carry():
    out = charts._short([0.1 + 0.2, 123456.7, -0.000123456789, None, math.nan, math.inf, 0, 1e-320])
    assert out == [0.3, 123460.0, -0.00012346, None, None, None, 0.0, 1e-320]
    json.dumps(out, allow_nan=False)
