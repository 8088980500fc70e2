"""Filters for the diagnostics pages and the tag behind the run dashboard's diagnostics slot."""

from __future__ import annotations

import math
from typing import Any

from django import template

from webapp.diagnostics import links, services

register = template.Library()


def _finite(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


@register.filter
def pct(value: Any, digits: int = 0) -> str:
    """0.1234 -> "12%"; missing -> "—"."""
    v = _finite(value)
    return "—" if v is None else f"{100 * v:.{int(digits)}f}%"


@register.filter
def fnum(value: Any, digits: int = 3) -> str:
    v = _finite(value)
    return "—" if v is None else f"{v:.{int(digits)}g}"


@register.filter
def bar_width(value: Any) -> int:
    """A share or fraction as a 0..100 width (negative shares draw empty)."""
    v = _finite(value)
    return 0 if v is None else int(round(100 * min(max(v, 0.0), 1.0)))


@register.filter
def group_url(group_id: int) -> str:
    return links.group_url(group_id)


@register.simple_tag
def diagnostics_summary(run: Any) -> dict[str, Any] | None:
    """The dashboard slot's summary: cached, over a bounded window, never an error
    on the dashboard."""
    return services.slot_summary(run)


@register.simple_tag
def explorer_link(run_id: int, sort: str | None = None, order: str = "desc") -> str:
    """The explorer of a run, sorted by `sort` (escaped by the template like any other string)."""
    return links.explorer_url(run_id, sort, order)
