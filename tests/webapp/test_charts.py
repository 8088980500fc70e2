"""Figure builders: pure functions from aggregates to plotly dicts (no database, no browser)."""

from __future__ import annotations

import json

import pytest

from webapp.runs import charts
from webapp.runs.queries import ComponentSeries, DashboardData, Series


def _data() -> DashboardData:
    reward = Series(steps=[0, 1, 2], mean=[0.1, 0.5, None], std=[0.2, None, None])
    comps = [
        ComponentSeries(
            name="correct",
            steps=[0, 1, 2],
            mean=[0.1, 0.4, 0.9],
            batch_std=[0.3, 0.4, 0.1],
            within_std=[0.2, 0.1, 0.0],
            zero_std_frac=[0.0, 0.5, 1.0],
        ),
        ComponentSeries(
            name="format",
            steps=[0, 1],
            mean=[1.0, 1.0],
            batch_std=[0.0, 0.0],
            within_std=[0.0, 0.0],
            zero_std_frac=[1.0, 1.0],
            batch_std_source="trainer",
        ),
    ]
    return DashboardData(
        reward=reward,
        zero_std_steps=[0, 1, 2],
        zero_std_frac=[0.0, 0.5, 1.0],
        components=comps,
        metrics={"kl": ([0, 1], [0.01, 0.02]), "loss": ([0, 1], [1.0, 0.9])},
        n_groups=6,
        n_rollouts=48,
    )


def test_it_draws_the_reward_mean_with_a_std_band_that_skips_missing_values():
    fig = charts.reward_figure(_data().reward)
    upper, lower, mean = fig["data"]  # one y axis: the std is the band, not a second trace
    assert upper["y"][0] == pytest.approx(0.1 + 0.2) and lower["y"][0] == pytest.approx(0.1 - 0.2)
    assert upper["y"][1:] == [None, None] and lower["fill"] == "tonexty"
    assert mean["y"] == [0.1, 0.5, None]
    assert "yaxis2" not in fig["layout"] and all("yaxis" not in t for t in fig["data"])


def test_it_puts_within_group_and_batch_std_on_one_chart_with_distinct_labels():
    d = _data()
    sql = charts.component_std_figure(d.components[0], "#000")
    logged = charts.component_std_figure(d.components[1], "#000")
    assert [t["name"] for t in sql["data"]] == [
        "within-group std (mean over groups)",
        "batch std (over the step)",
    ]
    assert logged["data"][1]["name"] == "batch std (trainer log)"
    assert sql["data"][0]["y"] == [0.2, 0.1, 0.0] and sql["data"][1]["y"] == [0.3, 0.4, 0.1]
    assert "within-group" in charts.BATCH_VS_GROUP and "rewards/<name>/std" in charts.BATCH_VS_GROUP


def test_it_charts_the_zero_std_fraction_overall_and_per_component_on_a_unit_axis():
    d = _data()
    fig = charts.zero_std_figure(d.zero_std_steps, d.zero_std_frac, d.components)
    assert [t["name"] for t in fig["data"]] == ["aggregate (no advantage)", "correct", "format"]
    assert fig["data"][2]["y"] == [1.0, 1.0] and fig["layout"]["yaxis"]["range"] == [0, 1.02]


def test_it_lays_out_every_dashboard_figure_under_a_unique_id():
    out = charts.dashboard_figures(_data())
    assert set(out["all"]) == {
        "reward",
        "zero-std",
        "mean-0",
        "std-0",
        "mean-1",
        "std-1",
        "metric:kl",
        "metric:loss",
    }
    assert [c["name"] for c in out["components"]] == ["correct", "format"]
    assert [m["name"] for m in out["metrics"]] == ["kl", "loss"]  # sorted by name
    assert out["all"]["metric:kl"]["data"][0]["y"] == [0.01, 0.02]
    json.dumps(out["all"], allow_nan=False)  # plotly receives strict JSON: no NaN sneaks through


def test_it_switches_to_lines_only_for_long_runs():
    long = charts.line_trace(list(range(100)), [0.0] * 100, "x", "#000")
    short = charts.line_trace([0, 1], [0.0, 1.0], "x", "#000")
    assert long["mode"] == "lines" and short["mode"] == "lines+markers"


def test_it_scales_a_sparkline_into_its_box():
    pts = charts.sparkline_points([0.0, 0.5, 1.0], width=100, height=20, pad=0)
    assert pts == "0.0,20.0 50.0,10.0 100.0,0.0"
    flat = charts.sparkline_points([0.3, 0.3], width=10, height=10, pad=0)
    assert flat == "0.0,10.0 10.0,10.0"  # a constant curve lies flat instead of dividing by zero
    assert charts.sparkline_points([]) == ""


def test_it_keeps_five_significant_digits_in_chart_values():
    trace = charts.line_trace([0, 1, 2], [1 / 3, 2.5e-7 / 3, None], "x", "#000")
    assert trace["y"] == [
        0.33333,
        8.3333e-08,
        None,
    ]  # small values (a KL of 1e-7) keep their digits
