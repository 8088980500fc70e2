"""Plotly figure dicts built from per-step aggregates. Pure functions: no queries, no request.

Each figure is {"data": [...], "layout": {...}} ready for `Plotly.newPlot`; static/js/app.js draws
every `[data-chart]` element and turns a click on a point into the explorer filtered to that step.
Text in figures (component, metric and run names) is user- and model-controlled, and plotly renders
a subset of HTML in trace names, titles, annotations, hover text and category labels (a metric named
`<a href=//x>y</a>` became a link): every builder's figure passes through `escape_figure`. The page
embeds the figures with `json_script`, so nothing becomes markup outside plotly either.
"""

from __future__ import annotations

import functools
import html
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from webapp.runs.queries import ComponentSeries, DashboardData, Series

Figure = dict[str, Any]

PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#be185d", "#4d7c0f")
BATCH_VS_GROUP = (
    "Batch std (TRL's rewards/<name>/std) spreads over every rollout of the step, across prompts; "
    "within-group std is what GRPO divides by — only it makes an advantage."
)


# Keys whose strings plotly draws as (HTML-interpreting) text: trace and legend names, figure, axis,
# legend and colorbar titles, annotation, hover and bar texts, category labels on axes, tick labels.
TEXT_KEYS = frozenset(
    {"name", "text", "title", "hovertext", "x", "y", "z", "labels", "ticktext", "legendgrouptitle"}
)


def escape_figure(value: Any, text: bool = False) -> Any:
    """A copy of a figure (or a dict/list of figures) with every string under a TEXT_KEYS key
    HTML-escaped. Plotly turns &lt; &amp; back into characters when it draws, so a name reads as
    typed and never becomes a tag. Style values (colors, modes, templates) are left alone."""
    if isinstance(value, str):
        return html.escape(value, quote=False) if text else value
    if isinstance(value, dict):
        return {k: escape_figure(v, k in TEXT_KEYS) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        # A series of numbers (most of a figure): nothing to escape. (map/issuperset run in C: a
        # generator over every value cost the 500-step dashboard ~20 ms.)
        if _PLAIN.issuperset(map(type, value)):
            return list(value)
        return [escape_figure(v, text) for v in value]
    return value


_PLAIN = frozenset({int, float, type(None)})


def escaped(builder: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for figure builders: what they return is passed through `escape_figure`."""

    @functools.wraps(builder)
    def build(*args: Any, **kwargs: Any) -> Any:
        return escape_figure(builder(*args, **kwargs))

    return build


def _layout(title: str, y_title: str = "", **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {
            "text": title,
            "font": {"size": 13},
            "x": 0.01,
            "xanchor": "left",
            "y": 0.97,
            "yanchor": "top",
        },
        "margin": {"l": 48, "r": 16, "t": 44, "b": 24},
        "height": 240,
        "xaxis": {"zeroline": False, "hoverformat": "d"},  # no axis title: it is always the step
        "yaxis": {"title": {"text": y_title}, "zeroline": False},
        "legend": {
            "orientation": "h",
            "x": 1,
            "xanchor": "right",
            "y": 1.01,
            "yanchor": "bottom",
            "font": {"size": 10},
            "bgcolor": "rgba(255,255,255,0)",
        },
        "hovermode": "x unified",
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "#fbfbfa",
        "font": {"family": "system-ui, sans-serif", "size": 11, "color": "#222"},
    }
    layout.update(extra)
    return layout


# Digits kept in chart values: a 500-step dashboard's JSON halves, the hover still reads exact
SIGNIFICANT = 5


def _short(values: list[float | None]) -> list[float | None]:
    """Each value to SIGNIFICANT digits, for the whole series at once (a string round trip
    per value was a quarter of the 500-step dashboard's server time). q / 10**d with an
    integer q is the double nearest that decimal, so it prints with at most SIGNIFICANT
    digits. None and non-finite: None."""
    a = np.array(values, dtype=float)  # None -> nan
    nonzero = np.isfinite(a) & (a != 0)
    digits = np.zeros(a.shape)
    digits[nonzero] = SIGNIFICANT - 1 - np.floor(np.log10(np.abs(a[nonzero])))
    with np.errstate(
        all="ignore"
    ):  # 10**d overflows only for values under 1e-300: kept as they are
        scale = 10.0 ** np.abs(digits)
        out = np.where(digits >= 0, np.round(a * scale) / scale, np.round(a / scale) * scale)
    out = np.where(np.isfinite(out), out, a)
    if np.isfinite(out).all():
        return out.tolist()
    return [v if math.isfinite(v) else None for v in out.tolist()]


def line_trace(
    x: list[int], y: list[float | None], name: str, color: str, **extra: Any
) -> dict[str, Any]:
    trace: dict[str, Any] = {
        "type": "scatter",
        "mode": "lines+markers" if len(x) <= 60 else "lines",
        "x": list(x),
        "y": _short(y),
        "name": name,
        "line": {"color": color, "width": 1.8},
        "marker": {"size": 4},
    }
    trace.update(extra)
    return trace


@escaped
def reward_figure(reward: Series) -> Figure:
    """Aggregate reward mean per step on one y axis, the batch std (over the step's rollouts) drawn
    as a ±1 std band around it. (A std trace on a second axis read as if it crossed the mean, or
    zero: one axis, one unit.) Trace 2 is the mean: the live page and tests read it there."""
    upper = [
        None if m is None or s is None else m + s
        for m, s in zip(reward.mean, reward.std, strict=True)
    ]
    lower = [
        None if m is None or s is None else m - s
        for m, s in zip(reward.mean, reward.std, strict=True)
    ]
    band = {"line": {"width": 0}, "hoverinfo": "skip", "mode": "lines"}
    return {
        "data": [
            line_trace(reward.steps, upper, "mean + std", PALETTE[0], showlegend=False, **band),
            line_trace(
                reward.steps,
                lower,
                "± 1 batch std",
                PALETTE[0],
                fill="tonexty",
                fillcolor="rgba(37,99,235,0.15)",
                **band,
            ),
            line_trace(reward.steps, reward.mean, "reward mean", PALETTE[0]),
        ],
        "layout": _layout("Aggregate reward (mean, ± 1 batch std band)", "reward"),
    }


@escaped
def zero_std_figure(
    steps: list[int], overall: list[float | None], components: list[ComponentSeries]
) -> Figure:
    """Fraction of groups with no signal per step: the aggregate (no advantage at all)
    and each component."""
    data = [
        line_trace(
            steps, overall, "aggregate (no advantage)", "#111", line={"color": "#111", "width": 2.4}
        )
    ]
    for i, cs in enumerate(components):
        data.append(
            line_trace(
                cs.steps,
                cs.zero_std_frac,
                cs.name,
                PALETTE[i % len(PALETTE)],
                line={"color": PALETTE[i % len(PALETTE)], "width": 1.2, "dash": "dot"},
            )
        )
    return {
        "data": data,
        "layout": _layout(
            "Zero-std groups (fraction)",
            "fraction",
            yaxis={"range": [0, 1.02], "title": {"text": "fraction"}},
        ),
    }


@escaped
def component_mean_figure(cs: ComponentSeries, color: str) -> Figure:
    return {
        "data": [line_trace(cs.steps, cs.mean, f"{cs.name} mean", color)],
        "layout": _layout(f"{cs.name} · mean", "mean", showlegend=False),
    }


@escaped
def component_std_figure(cs: ComponentSeries, color: str) -> Figure:
    """Within-group std (drives advantages) beside the batch std (what TRL logs), same axis."""
    batch_label = (
        "batch std (trainer log)"
        if cs.batch_std_source == "trainer"
        else "batch std (over the step)"
    )
    return {
        "data": [
            line_trace(cs.steps, cs.within_std, "within-group std (mean over groups)", color),
            line_trace(
                cs.steps,
                cs.batch_std,
                batch_label,
                "#6b7280",
                line={"color": "#6b7280", "width": 1.2, "dash": "dash"},
            ),
        ],
        "layout": _layout(f"{cs.name} · std: within-group vs batch", "std"),
    }


@escaped
def metric_figure(name: str, steps: list[int], values: list[float | None], color: str) -> Figure:
    return {
        "data": [line_trace(steps, values, name, color)],
        "layout": _layout(name, "", showlegend=False),
    }


def dashboard_figures(data: DashboardData, table_scalars: bool = True) -> dict[str, Any]:
    """Every dashboard chart: `all` maps a chart id to its figure (one JSON blob on the page); the
    other keys list those ids in the order the template lays them out. Metrics logged at one step
    only are `scalars` (name, step, value) for a table, unless `table_scalars` is false (the live
    points of a metric may be one step long)."""
    figures: dict[str, Figure] = {
        "reward": reward_figure(data.reward),
        "zero-std": zero_std_figure(data.zero_std_steps, data.zero_std_frac, data.components),
    }
    components = []
    for i, cs in enumerate(data.components):
        color = PALETTE[i % len(PALETTE)]
        figures[f"mean-{i}"] = component_mean_figure(cs, color)
        figures[f"std-{i}"] = component_std_figure(cs, color)
        components.append(
            {
                "name": cs.name,
                "mean": f"mean-{i}",
                "std": f"std-{i}",
                "batch_std_source": cs.batch_std_source,
            }
        )
    metrics, scalars = [], []
    several = len(data.reward.steps) > 1 or any(
        len(steps) > 1 for steps, _ in data.metrics.values()
    )
    for i, (name, (steps, values)) in enumerate(sorted(data.metrics.items())):
        if (
            table_scalars and len(steps) == 1 and several
        ):  # end-of-training numbers (train_runtime, total_flos): a row, not a dot
            scalars.append(
                {
                    "name": name,
                    "step": steps[0],
                    "value": values[0],
                    "text": "—" if values[0] is None else f"{values[0]:.6g}",
                }
            )
            continue
        # The id is the metric's name: stable when a live run starts logging a new metric.
        figures[f"metric:{name}"] = metric_figure(name, steps, values, PALETTE[i % len(PALETTE)])
        metrics.append({"name": name, "id": f"metric:{name}"})
    from webapp.tokens.charts import token_figures  # it builds on this module's helpers

    tokens = token_figures(data.tokens)  # only when the run recorded tokens
    figures.update(tokens)
    return {
        "all": figures,
        "components": components,
        "metrics": metrics,
        "scalars": scalars,
        "tokens": list(tokens),
    }


def live_points(data: DashboardData) -> dict[str, dict[str, list[list[Any]]]]:
    """The new points of every chart, for a live page holding all steps before the ones in `data`:
    chart id -> {"x": [one list per trace], "y": [...]} (the page drops its points from the first
    step sent and extends each trace with these: Plotly.extendTraces). Values as the figures have
    them (rounded, escaped)."""
    return {
        chart_id: {"x": [t["x"] for t in fig["data"]], "y": [t["y"] for t in fig["data"]]}
        for chart_id, fig in dashboard_figures(data, table_scalars=False)["all"].items()
    }


def sparkline_points(
    values: list[float], width: int = 120, height: int = 28, pad: float = 2.0
) -> str:
    """SVG polyline points for a curve scaled into width x height (numbers only: safe to inline)."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    n = len(values)
    step = (width - 2 * pad) / max(n - 1, 1)
    pts = []
    for i, v in enumerate(values):
        x = pad + i * step
        y = height - pad - (v - lo) / span * (height - 2 * pad)
        pts.append(f"{x:.1f},{y:.1f}")
    return " ".join(pts)
