"""Plotly figure dicts for the replay page, built from `analysis.compare`'s output. Pure functions.

Drawn by static/js/app.js from a `json_script` blob. Component names come from the run's environment
(an API client may name them anything), so `figures` passes through the project's `escape_figure`
(plotly renders a few tags in names and tick labels). Histogram bins are category labels, not
numbers: a click on a bar must not navigate to the explorer at a "step".
"""

from __future__ import annotations

import itertools
from typing import Any

from webapp.diagnostics.charts import _layout
from webapp.figures import escaped

Figure = dict[str, Any]
OLD, NEW = "#94a3b8", "#2563eb"


def histogram_figure(row: dict[str, Any]) -> Figure:
    h = row["hist"]
    edges = h["edges"]
    labels = [f"{a:.2f}–{b:.2f}" for a, b in itertools.pairwise(edges)]
    data = [
        {"type": "bar", "x": labels, "y": h["old"], "name": "original", "marker": {"color": OLD}},
        {"type": "bar", "x": labels, "y": h["new"], "name": "replay", "marker": {"color": NEW}},
    ]
    return {
        "data": data,
        "layout": _layout(
            # no x title: the slanted bin labels (the values) took its place and overlapped it
            f"{row['name']}: distribution of values",
            "rollouts",
            "",
            barmode="group",
            height=230,
        ),
    }


def _bars(
    rows: list[dict[str, Any]], field: str, title: str, y_title: str, **layout: Any
) -> Figure:
    names = [r["name"] for r in rows]
    data = [
        {
            "type": "bar",
            "x": names,
            "y": [r[side][field] for r in rows],
            "name": label,
            "marker": {"color": color},
        }
        for side, label, color in (("old", "original", OLD), ("new", "replay", NEW))
    ]
    return {"data": data, "layout": _layout(title, y_title, "", barmode="group", **layout)}


@escaped
def figures(report: dict[str, Any]) -> dict[str, Figure]:
    rows = report["components"]
    components = [r for r in rows if r["weight"] is not None]
    out = {
        "share": _bars(components, "share", "Share of the advantage", "share"),
        "zero-std": _bars(
            rows,
            "zero_std_frac",
            "Zero within-group std: groups that teach nothing",
            "fraction",
            yaxis={"range": [0, 1.02], "title": {"text": "fraction of groups"}},
        ),
        "within-std": _bars(rows, "within_std", "Mean within-group std", "std"),
    }
    for i, row in enumerate(rows):
        if row["replayed"]:
            out[f"hist-{i}"] = histogram_figure(row)
    return out
