"""Plotly figure dicts built from per-step aggregates. Pure functions: no queries, no request.

Each figure is {"data": [...], "layout": {...}} ready for `Plotly.newPlot`; static/js/app.js draws
every `[data-chart]` element and turns a click on a point into the explorer filtered to that step.
Text in figures (component, metric and run names) is user- and model-controlled, and plotly renders
a subset of HTML in trace names, titles, annotations, hover text and category labels (a metric named
`<a href=//x>y</a>` became a link): every builder's figure passes through `escape_figure`. The page
embeds the figures with `json_script`, so nothing becomes markup outside plotly either.
"""

from __future__ import annotations

from typing import Any

from webapp.figures import (  # noqa: F401 - re-exported for the app charts
    PALETTE,
    SIGNIFICANT,
    Figure,
    _layout,
    _short,
    escape_figure,
    escaped,
    line_trace,
)
from webapp.runs.queries import ComponentSeries, DashboardData, Series
from webapp.tokens.charts import token_figures

BATCH_VS_GROUP = (
    "Batch std (TRL's rewards/<name>/std) spreads over every rollout of the step, across prompts; "
    "within-group std is what GRPO divides by — only it makes an advantage."
)


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
