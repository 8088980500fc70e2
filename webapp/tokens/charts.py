"""Token figures: the run dashboard's per-step token charts and a rollout's strip chart of one
quantity along its tokens. Pure functions over plain lists (no queries), every figure escaped as
webapp/runs/charts.py's are.

The quantities a token view colours by, and their strip charts, are named by QUANTITIES' keys; the
token view's JavaScript (static/js/tokens.js) reads the same names from the JSON it fetches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from webapp.figures import PALETTE, Figure, _layout, escape_figure, escaped, line_trace

# key -> (label, unit). Order: how the view's selector lists them.
QUANTITIES: dict[str, tuple[str, str]] = {
    "sampler": ("sampler log-prob", "nats"),
    "trainer": ("trainer log-prob", "nats"),
    "mismatch": ("|mismatch| (trainer - sampler)", "nats"),
    "entropy": ("entropy", "nats"),
    "advantage": ("advantage x mask", ""),
}
STRIP_POINTS = 1500  # buckets of a long rollout's strip chart: each keeps its min and max token


def _array(tokens: dict[str, Any], name: str) -> np.ndarray | None:
    v = tokens.get(name)
    return None if v is None else np.asarray(v, dtype=np.float64)


def quantity_values(tokens: dict[str, Any], key: str) -> np.ndarray | None:
    """The per-token values of `key` (float64, NaN where a token has none) from the token arrays
    (lists or numpy arrays by field name), or None when the rollout lacks what it needs."""
    if key in ("sampler", "trainer", "entropy"):
        return _array(
            tokens, {"sampler": "sampler_logprobs", "trainer": "trainer_logprobs"}.get(key, key)
        )
    if key == "mismatch":
        s, t = _array(tokens, "sampler_logprobs"), _array(tokens, "trainer_logprobs")
        return None if s is None or t is None else np.abs(t - s)
    if key == "advantage":
        adv, mask = _array(tokens, "advantages"), _array(tokens, "loss_mask")
        if adv is None:
            return None
        return adv if mask is None else adv * mask
    raise KeyError(key)


def nullable(a: np.ndarray) -> list[float | None]:
    """The values as a list, None for NaN and infinities (JSON has neither)."""
    out = a.tolist()
    for i in np.flatnonzero(~np.isfinite(a)).tolist():
        out[i] = None
    return out


def _floats(values: Sequence[float | None] | np.ndarray) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values.astype(np.float64)
    return np.array([math.nan if v is None else v for v in values], dtype=np.float64)


def strip_points(
    values: Sequence[float | None], max_points: int = STRIP_POINTS
) -> tuple[list[int], list[float | None]]:
    """(token indices, values) to draw: every token when few, else per bucket of consecutive tokens
    its lowest and its highest, in token order, so a single outlier token still shows."""
    a = _floats(values)
    n = a.size
    if n <= 2 * max_points:
        return list(range(n)), nullable(a)
    size = -(-n // max_points)  # buckets of `size` consecutive tokens, the last one padded
    padded = np.full(size * -(-n // size), np.nan)
    padded[:n] = a
    blocks = padded.reshape(-1, size)
    finite = np.isfinite(blocks)
    base = np.arange(blocks.shape[0]) * size
    lo = np.where(finite, blocks, np.inf).argmin(axis=1) + base
    hi = np.where(finite, blocks, -np.inf).argmax(axis=1) + base
    # A bucket with no value keeps its first token (a gap in the line); min and max in token order.
    pairs = np.sort(np.column_stack([lo, hi]), axis=1)
    pairs[~finite.any(axis=1)] = base[~finite.any(axis=1), None]
    flat = pairs.ravel()
    keep = np.concatenate([[True], flat[1:] != flat[:-1]])
    xs = flat[keep]
    return xs.tolist(), nullable(a[xs])


def turn_starts(turns: Sequence[int] | np.ndarray) -> list[int]:
    """The index of each turn's first token."""
    t = np.asarray(turns)
    if not t.size:
        return []
    return [0, *(np.flatnonzero(t[1:] != t[:-1]) + 1).tolist()]


def _spans(flags: Sequence[bool] | np.ndarray) -> list[tuple[int, int]]:
    """[start, end) runs of consecutive true flags."""
    f = np.concatenate([[False], np.asarray(flags, dtype=bool), [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(f))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


MAX_SHAPES = 400  # turn lines and masked spans drawn; a longer list is thinned (the view has all)


def strip_figure(
    values: Sequence[float | None] | np.ndarray,
    key: str,
    turn_starts: Sequence[int] = (),
    masked: Sequence[bool] | np.ndarray | None = None,
    spans: list[tuple[int, int]] | None = None,
) -> Figure:
    """The strip chart of one quantity along a rollout: x the token index, masked tokens shaded
    grey, a dotted line at each turn's first token. Hovering reads the token index and value; the
    token view moves its focus to a clicked token."""
    label, unit = QUANTITIES[key]
    xs, ys = strip_points(values)
    shapes = [
        {
            "type": "rect",
            "xref": "x",
            "yref": "paper",
            "x0": a - 0.5,
            "x1": b - 0.5,
            "y0": 0,
            "y1": 1,
            "fillcolor": "rgba(107,114,128,0.16)",
            "line": {"width": 0},
            "layer": "below",
        }
        for a, b in (spans if spans is not None else _spans(masked if masked is not None else []))[
            :MAX_SHAPES
        ]
    ]
    shapes += [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": t - 0.5,
            "x1": t - 0.5,
            "y0": 0,
            "y1": 1,
            "line": {"color": "#6b7280", "width": 1, "dash": "dot"},
        }
        for t in list(turn_starts)[1:MAX_SHAPES]
    ]
    trace = line_trace(xs, ys, label, PALETTE[0], mode="lines", connectgaps=False)
    trace["line"]["width"] = 1.2
    trace["hovertemplate"] = "token %{x}<br>%{y:.4g}<extra></extra>"
    layout = _layout(label, unit, height=150, showlegend=False, shapes=shapes, hovermode="closest")
    layout["margin"] = {"l": 48, "r": 16, "t": 30, "b": 28}
    layout["xaxis"] = {
        "zeroline": False,
        "hoverformat": "d",
        "range": [-0.5, max(len(values), 1) - 0.5],
    }
    return escape_figure({"data": [trace], "layout": layout})


def strip_figures(tokens: dict[str, Any]) -> dict[str, Figure]:
    """A strip chart per quantity the rollout carries."""
    mask = tokens.get("loss_mask")
    spans = _spans(~np.asarray(mask, dtype=bool)) if mask is not None else []
    turns = tokens.get("turn")
    starts = turn_starts(turns) if turns is not None else []
    out = {}
    for key in QUANTITIES:
        values = quantity_values(tokens, key)
        if values is not None:
            out[key] = strip_figure(values, key, starts, spans=spans)
    return out


# --------------------------------------------------------------------------- the run dashboard


def _pair(
    title: str,
    steps: list[int],
    left: tuple[str, list[float | None]],
    right: tuple[str, list[float | None]] | None,
    y_title: str,
    y2_title: str = "",
    **extra: Any,
) -> Figure:
    data = [line_trace(steps, left[1], left[0], PALETTE[0])]
    layout = _layout(title, y_title, **extra)
    if right is not None:
        data.append(
            line_trace(
                steps,
                right[1],
                right[0],
                PALETTE[1],
                yaxis="y2",
                line={"color": PALETTE[1], "width": 1.2, "dash": "dot"},
            )
        )
        layout["margin"] = {"l": 48, "r": 48, "t": 44, "b": 24}
        layout["yaxis2"] = {
            "title": {"text": y2_title},
            "overlaying": "y",
            "side": "right",
            "tickmode": "auto",
            "nticks": 5,
            "zeroline": False,
            "showgrid": False,
            "rangemode": "tozero",
        }
    return {"data": data, "layout": layout}


@escaped
def mismatch_figure(series: dict[str, list]) -> Figure:
    return _pair(
        "Sampler/trainer mismatch |delta log-prob|",
        series["steps"],
        ("mean |delta|", series["mean_abs_delta"]),
        ("max |delta|", series["max_abs_delta"]),
        "mean (nats)",
        "max (nats)",
    )


@escaped
def off_policy_figure(series: dict[str, list]) -> Figure:
    return _pair(
        "Off-policy: k3 KL and importance ratios outside [0.5, 2]",
        series["steps"],
        ("k3 KL(sampler || trainer)", series["k3"]),
        ("ratio outside [0.5, 2] (fraction)", series["ratio_out_fraction"]),
        "k3",
        "fraction",
    )


@escaped
def entropy_figure(series: dict[str, list]) -> Figure:
    return _pair(
        "Token entropy",
        series["steps"],
        ("mean entropy", series["mean_entropy"]),
        ("near-zero entropy (fraction)", series["low_entropy_fraction"]),
        "nats",
        "fraction",
    )


@escaped
def masked_figure(series: dict[str, list]) -> Figure:
    fig = _pair(
        "Loss-masked tokens (fraction)",
        series["steps"],
        ("masked", series["masked_fraction"]),
        None,
        "fraction",
        showlegend=False,
    )
    fig["layout"]["yaxis"]["range"] = [0, 1.02]
    return fig


TOKEN_CHARTS = {
    "tokens-mismatch": (mismatch_figure, ("mean_abs_delta", "max_abs_delta")),
    "tokens-offpolicy": (off_policy_figure, ("k3", "ratio_out_fraction")),
    "tokens-entropy": (entropy_figure, ("mean_entropy", "low_entropy_fraction")),
    "tokens-masked": (masked_figure, ("masked_fraction",)),
}


def token_figures(series: dict[str, list] | None) -> dict[str, Figure]:
    """The dashboard's token charts (chart id -> figure) for a run's per-step token statistics
    (TokenSteps.series(): "steps" and one list per statistic). A chart whose statistics the run
    never recorded (a run without sampler log-probs has no mismatch) is left out; no series at all,
    or no steps: no charts."""
    if not series or not series.get("steps"):
        return {}
    out = {}
    for chart_id, (build, keys) in TOKEN_CHARTS.items():
        if any(any(v is not None for v in series.get(k) or []) for k in keys):
            out[chart_id] = build(series)
    return out
