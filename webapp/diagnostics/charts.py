"""Plotly figure dicts for the diagnostics pages. Pure functions over plain data: no
queries, no request.

Figures follow webapp/runs/charts.py's convention ({"data", "layout"}, drawn by
static/js/app.js from a `json_script` blob); every builder is `@escaped`, because plotly
renders HTML in names and titles.
"""

from __future__ import annotations

from typing import Any

# escaped: component and run names are user- and model-controlled
from webapp.figures import escaped, line_trace

Figure = dict[str, Any]

PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#be185d", "#4d7c0f")


def _layout(title: str, y_title: str = "", x_title: str = "step", **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {"text": title, "font": {"size": 13}, "x": 0.01, "xanchor": "left"},
        "margin": {"l": 52, "r": 12, "t": 32, "b": 36},
        "height": 260,
        "xaxis": {"title": {"text": x_title}, "zeroline": False},
        "yaxis": {"title": {"text": y_title}, "zeroline": False},
        "legend": {"font": {"size": 11}},  # placed by _legend_below
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "#fbfbfa",
        "font": {"family": "system-ui, sans-serif", "size": 11, "color": "#222"},
    }
    layout.update(extra)
    return layout


LEGEND_ROW = 17  # px per legend entry at font size 11


def _legend_below(fig: Figure) -> Figure:
    """One legend row per trace under the "step" title, in a bottom margin grown to hold
    them. A legend placed at a paper-relative y (under the plot) sat on the axis title once
    names were long."""
    entries = [t for t in fig["data"] if t.get("showlegend", True)]
    if len(entries) < 2:  # plotly shows no legend for a single trace
        return fig
    layout = fig["layout"]
    extra = LEGEND_ROW * len(entries) + 8
    margin = layout["margin"]
    layout["margin"] = {**margin, "b": margin["b"] + extra}
    layout["height"] = layout["height"] + extra
    layout["legend"] = {
        **layout["legend"],
        "orientation": "v",
        "yref": "container",
        "y": 0,
        "yanchor": "bottom",
        "x": 0,
        "xanchor": "left",
    }
    return fig


def onset_marks(findings: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Layout additions marking each finding's onset step: a dashed vertical line and a label
    (plotly renders annotation text as text, and it is only a finding code and a step)."""
    onsets: dict[int, list[str]] = {}
    for f in findings or []:
        if f.get("onset_step") is not None:
            onsets.setdefault(int(f["onset_step"]), []).append(str(f.get("code", "")))
    shapes = [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": s,
            "x1": s,
            "y0": 0,
            "y1": 1,
            "line": {"color": "#b91c1c", "width": 1.2, "dash": "dash"},
        }
        for s in sorted(onsets)
    ]
    # Labels sit just right of their line, one row lower each, so onsets a few steps
    # apart stay readable.
    notes = [
        {
            "x": s,
            "y": 1 - 0.09 * (k % 4),
            "xref": "x",
            "yref": "paper",
            "xanchor": "left",
            "yanchor": "top",
            "showarrow": False,
            "text": f" step {s}: {', '.join(sorted(set(codes)))}",
            "bgcolor": "rgba(255,255,255,0.8)",
            "font": {"size": 10, "color": "#b91c1c"},
        }
        for k, (s, codes) in enumerate(sorted(onsets.items()))
    ]
    return {"shapes": shapes, "annotations": notes} if shapes else {}


@escaped
def zero_std_figure(agg: dict[str, Any], findings: list[dict[str, Any]] | None = None) -> Figure:
    """Fraction of groups where each component (and the aggregate reward) is constant, per step."""
    steps = agg["steps"]
    data = [
        line_trace(steps, s["zero_std_frac"], name, PALETTE[i % len(PALETTE)])
        for i, (name, s) in enumerate(agg["components"].items())
    ]
    data.append(
        line_trace(
            steps,
            agg["reward_zero_std_frac"],
            "aggregate reward",
            "#111",
            line={"color": "#111", "width": 2.4, "dash": "dot"},
        )
    )
    return _legend_below(
        {
            "data": data,
            "layout": _layout(
                "Zero within-group std: groups that teach nothing",
                "fraction of groups",
                yaxis={"range": [0, 1.02], "title": {"text": "fraction of groups"}},
                **onset_marks(findings),
            ),
        }
    )


@escaped
def at_max_figure(
    over_time: dict[str, Any], findings: list[dict[str, Any]] | None = None
) -> Figure:
    """Per step of the window: each component's share of rollouts at the top of its range
    (saturation), with the findings' onsets marked."""
    steps = over_time.get("steps") or []
    data = [
        line_trace(steps, s["at_max"], name, PALETTE[i % len(PALETTE)])
        for i, (name, s) in enumerate((over_time.get("components") or {}).items())
    ]
    return _legend_below(
        {
            "data": data,
            "layout": _layout(
                "Share of rollouts at the component's maximum, per step",
                "share",
                yaxis={"range": [0, 1.02], "title": {"text": "share of rollouts"}},
                **onset_marks(findings),
            ),
        }
    )


def _per_component(agg: dict[str, Any], field: str) -> list[dict[str, Any]]:
    return [
        line_trace(agg["steps"], s[field], name, PALETTE[i % len(PALETTE)])
        for i, (name, s) in enumerate(agg["components"].items())
    ]


@escaped
def within_std_figure(agg: dict[str, Any]) -> Figure:
    return _legend_below(
        {
            "data": _per_component(agg, "std"),
            "layout": _layout("Mean within-group std per component", "std"),
        }
    )


@escaped
def component_mean_figure(
    agg: dict[str, Any], findings: list[dict[str, Any]] | None = None
) -> Figure:
    return _legend_below(
        {
            "data": _per_component(agg, "mean"),
            "layout": _layout("Component means", "mean", **onset_marks(findings)),
        }
    )


@escaped
def share_figure(health: dict[str, Any]) -> Figure:
    """Each component's share of the advantage next to its share of the weights."""
    comps = health["components"]
    names = [c["name"] for c in comps]
    total_w = sum(abs(c["weight"] or 0) for c in comps) or 1.0
    return _legend_below(
        {
            "data": [
                {
                    "type": "bar",
                    "x": names,
                    "y": [abs(c["weight"] or 0) / total_w for c in comps],
                    "name": "share of |weights|",
                    "marker": {"color": "#cbd5e1"},
                },
                {
                    "type": "bar",
                    "x": names,
                    "y": [c["share"] for c in comps],
                    "name": "share of the advantage",
                    "marker": {"color": PALETTE[0]},
                },
            ],
            "layout": _layout(
                "What the advantage is made of", "share", x_title="component", barmode="group"
            ),
        }
    )


@escaped
def corr_figure(health: dict[str, Any]) -> Figure:
    labels = health["corr_labels"]
    z = health["corr"]
    text = [["" if v is None else f"{v:.2f}" for v in row] for row in z]
    return {
        "data": [
            {
                "type": "heatmap",
                "x": labels,
                "y": labels,
                "z": z,
                "zmin": -1,
                "zmax": 1,
                "colorscale": "RdBu",
                "reversescale": True,
                "text": text,
                "texttemplate": "%{text}",
                "hoverongaps": False,
            }
        ],
        "layout": _layout(
            "Within-group correlations (what GRPO sees)",
            "",
            x_title="",
            height=300 + 12 * len(labels),
            yaxis={"autorange": "reversed", "automargin": True},
            xaxis={"automargin": True},  # long component names, slanted, were cut off at the bottom
            margin={"l": 96, "r": 12, "t": 32, "b": 60},
        ),
    }


@escaped
def ablation_compare_figure(rows: list[dict[str, Any]]) -> Figure:
    """One bar group per metric, one bar per ablation."""
    metrics = [
        ("mean_abs_delta", "mean |Δ adv|"),
        ("sign_flip_frac", "sign flips"),
        ("best_different_frac", "different best"),
        ("best_tied_frac", "best now tied"),
        ("zero_std_change", "Δ zero-std groups"),
    ]
    data = [
        {
            "type": "bar",
            "name": r["name"],
            "x": [label for _, label in metrics],
            "y": [r["results"].get(key) for key, _ in metrics],
            "marker": {"color": PALETTE[i % len(PALETTE)]},
        }
        for i, r in enumerate(rows)
    ]
    return _legend_below(
        {
            "data": data,
            "layout": _layout("Ablations side by side", "", x_title="", barmode="group"),
        }
    )


@escaped
def overlay_figures(series: list[dict[str, Any]]) -> dict[str, Figure]:
    """Reward mean per step for each run, and one figure per component with each run's mean."""
    dashes = ("solid", "dash", "dot", "dashdot")
    reward = [
        line_trace(s["steps"], s["reward_mean"], s["label"], PALETTE[i % len(PALETTE)])
        for i, s in enumerate(series)
    ]
    for i, s in enumerate(series):
        logged = [p for p in s.get("logged_reward") or [] if p[1] is not None]
        if logged:  # what the trainer itself logged as "reward", when it logged a number
            reward.append(
                line_trace(
                    [p[0] for p in logged],
                    [p[1] for p in logged],
                    f"{s['label']} (trainer log)",
                    PALETTE[i % len(PALETTE)],
                    line={"color": PALETTE[i % len(PALETTE)], "dash": "dot"},
                )
            )
    figs: dict[str, Figure] = {
        "reward": _legend_below(
            {"data": reward, "layout": _layout("Reward mean per step", "reward")}
        )
    }
    names: list[str] = []
    for s in series:
        names += [n for n in s["components"] if n not in names]
    for j, name in enumerate(names):
        data = [
            line_trace(
                s["steps"],
                s["components"][name],
                s["label"],
                PALETTE[i % len(PALETTE)],
                line={
                    "color": PALETTE[i % len(PALETTE)],
                    "width": 1.8,
                    "dash": dashes[i % len(dashes)],
                },
            )
            for i, s in enumerate(series)
            if name in s["components"]
        ]
        figs[f"component-{j}"] = _legend_below(
            {"data": data, "layout": _layout(f"{name}: mean per step", "mean")}
        )
    return figs
