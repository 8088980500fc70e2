"""Building blocks of every plotly figure on the pages: the palette, the common layout, a line
trace with values shortened to SIGNIFICANT digits, and `escape_figure` / `@escaped`, which
HTML-escape the strings plotly would draw as markup (names are user- and model-controlled). Each
app's `charts.py` builds its figures from these; this module imports nothing from the apps.
"""

from __future__ import annotations

import functools
import html
import math
from collections.abc import Callable
from typing import Any

import numpy as np

Figure = dict[str, Any]

PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#be185d", "#4d7c0f")


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
