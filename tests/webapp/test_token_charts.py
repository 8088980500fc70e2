"""Token figures and the token view's JSON: pure functions over plain arrays (no database, no
browser)."""

from __future__ import annotations

import json
import math

import numpy as np

from webapp.tokens import charts as tc
from webapp.tokens.tokenview import token_payload

TRANSCRIPT = [
    {"role": "assistant", "content": "def add(a, b):"},
    {"role": "tool", "name": "unit_tests", "content": "<b>2 passed</b>"},
    {"role": "assistant", "content": " return a+b"},
]


def tokens(n: int = 6) -> dict:
    return {
        "ids": [10, 11, 12, 13, 14, 15][:n],
        "offsets": [0, 4, 8, 0, 0, 7][:n],
        "sampler_logprobs": [-0.1, -2.0, -0.5, -1.0, -0.3, -0.01][:n],
        "trainer_logprobs": [-0.1, -1.0, -0.4, -1.0, -0.2, -0.02][:n],
        "entropy": [0.5, 1.2, 0.0, 2.0, 0.3, 0.01][:n],
        "advantages": [0.8] * n,
        "loss_mask": [1, 1, 1, 0, 1, 1][:n],
        "turn": [0, 0, 0, 1, 2, 2][:n],
    }


def test_it_computes_each_quantity_from_the_arrays():
    t = tokens()
    assert tc.quantity_values(t, "mismatch").tolist() == [
        0.0,
        1.0,
        0.09999999999999998,
        0.0,
        0.09999999999999998,
        0.01,
    ]
    assert tc.quantity_values(t, "advantage").tolist() == [0.8, 0.8, 0.8, 0.0, 0.8, 0.8]
    assert tc.quantity_values({"ids": [1]}, "mismatch") is None
    assert tc.quantity_values({"ids": [1], "advantages": [0.5]}, "advantage").tolist() == [0.5]


def test_it_draws_a_strip_chart_with_masked_spans_and_turn_lines():
    fig = tc.strip_figures(tokens())["entropy"]
    (trace,) = fig["data"]
    assert trace["x"] == [0, 1, 2, 3, 4, 5] and trace["y"] == [0.5, 1.2, 0.0, 2.0, 0.3, 0.01]
    shapes = fig["layout"]["shapes"]
    rects = [s for s in shapes if s["type"] == "rect"]
    lines = [s for s in shapes if s["type"] == "line"]
    assert [(r["x0"], r["x1"]) for r in rects] == [(2.5, 3.5)]  # token 3 is masked
    assert [ln["x0"] for ln in lines] == [2.5, 3.5]  # turns start at tokens 3 and 4
    assert fig["layout"]["title"]["text"] == "entropy"


def test_a_long_rollout_keeps_each_buckets_extremes():
    values = np.zeros(32_000)
    values[12_345] = -9.0  # one near-impossible token
    xs, ys = tc.strip_points(values, max_points=500)
    assert len(xs) <= 1000 and 12_345 in xs and min(y for y in ys if y is not None) == -9.0
    assert xs == sorted(xs) and {type(x) for x in xs} == {int}  # JSON encoders refuse int64


def test_the_dashboard_charts_only_what_the_run_recorded():
    series = {
        "steps": [0, 1, 2],
        "mean_abs_delta": [0.01, 0.02, 0.2],
        "max_abs_delta": [0.1, 0.3, 2.0],
        "k3": [1e-4, 2e-4, 0.02],
        "ratio_out_fraction": [0.0, 0.0, 0.1],
        "mean_entropy": [None, None, None],
        "low_entropy_fraction": [None, None, None],
        "masked_fraction": [0.1, 0.1, 0.12],
    }
    figs = tc.token_figures(series)
    assert set(figs) == {"tokens-mismatch", "tokens-offpolicy", "tokens-masked"}
    mean, peak = figs["tokens-mismatch"]["data"]
    assert mean["y"] == [0.01, 0.02, 0.2] and peak["yaxis"] == "y2"
    assert figs["tokens-offpolicy"]["data"][1]["y"] == [0.0, 0.0, 0.1]
    assert tc.token_figures({"steps": []}) == {} and tc.token_figures(None) == {}


def test_the_view_json_carries_text_turn_roles_and_colour_ranges():
    out = token_payload(tokens(), " return a+b", TRANSCRIPT)
    assert out["n"] == 6
    assert out["text"] == ["def ", "add(", "a, b):", "<b>2 passed</b>", " return", " a+b"]
    assert [(t["start"], t["role"], t["name"]) for t in out["turns"]] == [
        (0, "assistant", ""),
        (3, "tool", "unit_tests"),
        (4, "assistant", ""),
    ]
    q = {x["key"]: x for x in out["quantities"]}
    assert all(x["available"] for x in q.values())
    assert q["sampler"]["range"][1] == 0.0 and q["sampler"]["range"][0] <= -1.0
    assert q["advantage"]["range"] == [-0.8, 0.8]
    assert out["default"] == "sampler" and set(out["figures"]) == set(q)
    assert out["arrays"]["ref_logprobs"] is None
    json.dumps(out, allow_nan=False)


def test_the_view_json_of_a_rollout_with_ids_only():
    out = token_payload({"ids": [5, 6], "sampler_logprobs": [math.nan, -1.0]}, "", [])
    assert out["text"] == ["<5>", "<6>"]
    q = {x["key"]: x for x in out["quantities"]}
    assert q["sampler"]["available"] and not q["mismatch"]["available"]
    assert out["arrays"]["sampler_logprobs"] == [None, -1.0]
    assert out["loss_mask"] is None and out["turns"] == []


def test_a_long_strip_leaves_a_gap_where_tokens_have_no_value():
    values = np.linspace(-1, 0, 10_000)
    values[4_000:6_000] = np.nan  # e.g. tool output without log-probs
    xs, ys = tc.strip_points(values, max_points=100)
    gap = [y for x, y in zip(xs, ys, strict=True) if 4_100 <= x < 5_900]
    assert gap and all(y is None for y in gap)
    assert ys[0] == -1.0 and ys[-1] == 0.0
