"""Filters of the run pages' results tables: signed changes."""

from __future__ import annotations

import math
from typing import Any

from django import template

register = template.Library()


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@register.filter
def signed(value: Any, digits: int = 3) -> str:
    """A change with its sign: +0.128, −0.040; '—' when unknown."""
    v = _finite(value)
    return "—" if v is None else f"{v:+.{int(digits)}f}".replace("-", "−")


@register.filter
def signed_pct(value: Any) -> str:
    """A change of a share in percentage points: +12.5 pp; '—' when unknown."""
    v = _finite(value)
    return "—" if v is None else f"{100 * v:+.1f} pp".replace("-", "−")
