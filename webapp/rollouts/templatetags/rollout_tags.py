"""Rendering helpers for rollout pages. Model output is hostile: every string that reaches markup
here goes through `escape` / `format_html`; only numbers we computed are interpolated raw."""

from __future__ import annotations

import difflib
import json
import math
import re
from typing import Any

from django import template
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from webapp.rollouts.text import SNIPPET_CHARS, SearchQuery, highlight

register = template.Library()

PREVIEW_CHARS = 140
DIFF_MAX_CHARS = (
    20_000  # difflib is quadratic in the worst case; past this the tail is cut (and said so)
)
_WS_RE = re.compile(r"\s+")
_TOKEN_RE = re.compile(r"\s+|\w+|[^\w\s]")


@register.filter
def preview(text: Any, limit: int = PREVIEW_CHARS) -> str:
    """One line, whitespace collapsed, truncated. Returns plain text: the template escapes it."""
    one = _WS_RE.sub(" ", str(text or "")).strip()
    return one if len(one) <= limit else one[: limit - 1].rstrip() + "…"


@register.filter
def num(value: Any, digits: int = 3) -> str:
    """A float for tables: fixed digits, '—' for missing."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    value = _number(value)
    if value is None:
        return "—"
    return f"{value:.{int(digits)}f}"


def _number(value: Any) -> float | None:
    # Templates resolve a missing score's `.value` to "": anything not a finite number
    # is "no value".
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def bar_fraction(value: Any, lo: float | None, hi: float | None) -> float | None:
    """Where `value` sits in [lo, hi] as 0..1 (clamped); None when there is no value."""
    value = _number(value)
    if value is None:
        return None
    lo = 0.0 if lo is None else lo
    hi = 1.0 if hi is None else hi
    if hi <= lo:
        return 1.0 if value >= hi else 0.0
    return min(max((value - lo) / (hi - lo), 0.0), 1.0)


def bar_width(value: Any, component: Any) -> float | None:
    """The bar's length as 0..1: where the value sits in the component's range, except for a
    penalty, whose bar is the size of the penalty (its maximum, usually 0 = no penalty, draws an
    empty bar; its minimum a full red one), so a longer red bar always reads as worse."""
    lo, hi = getattr(component, "min_value", None), getattr(component, "max_value", None)
    frac = bar_fraction(value, lo, hi)
    if frac is None or getattr(component, "kind", "") != "penalty":
        return frac
    if lo is None and hi is None:  # a penalty with no declared range: its values run -1..0
        frac = bar_fraction(value, -1.0, 0.0)
    return None if frac is None else 1.0 - frac


@register.simple_tag
def bar(value: float | None, component: Any) -> SafeString:
    """A small horizontal bar for one component value; the exact value in the title (hover)."""
    name = getattr(component, "name", "")
    frac = bar_width(value, component)
    if frac is None:
        return format_html('<span class="bar none" title="{}: not scored">—</span>', name)
    penalty = getattr(component, "kind", "") == "penalty"
    return format_html(
        '<span class="bar {}" title="{}: {}{}"><span style="width:{}%"></span></span><span '
        'class="bar-num">{}</span>',
        "penalty" if penalty else "",
        name,
        f"{value:.4g}",
        " (a penalty: the red bar is its size, empty = no penalty)" if penalty else "",
        f"{frac * 100:.1f}",
        f"{value:.3g}",
    )


@register.filter
def search_snippet(rollout: Any, search: SearchQuery | None) -> SafeString | None:
    """Where a search matched the rollout, as HTML (terms in <mark>, the rest escaped): the text
    the explorer's search backend cut (snippet_from, snippet_text); None without a search."""
    if search is None:
        return None
    text = rollout.snippet_text or ""
    clipped_start, clipped_end = rollout.snippet_from > 1, len(text) > SNIPPET_CHARS
    return highlight(text[:SNIPPET_CHARS], search, clipped_start, clipped_end)


@register.filter
def pretty_json(value: Any) -> str:
    """Tool-call arguments arrive as a JSON string or an object: pretty-print either
    (plain text out)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError, RecursionError):
        return str(value)


def diff_html(a: str, b: str) -> SafeString:
    """Token-level diff of a -> b as escaped text with <del>/<ins> spans."""
    a, b = str(a or ""), str(b or "")
    cut = len(a) > DIFF_MAX_CHARS or len(b) > DIFF_MAX_CHARS
    ta, tb = _TOKEN_RE.findall(a[:DIFF_MAX_CHARS]), _TOKEN_RE.findall(b[:DIFF_MAX_CHARS])
    out: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(escape("".join(ta[i1:i2])))
            continue
        if i2 > i1:
            out.append(f"<del>{escape(''.join(ta[i1:i2]))}</del>")
        if j2 > j1:
            out.append(f"<ins>{escape(''.join(tb[j1:j2]))}</ins>")
    if cut:
        out.append(f'<span class="muted">\n… (diff cut at {DIFF_MAX_CHARS} characters)</span>')
    return mark_safe("".join(out))  # every piece of text above went through escape()


@register.simple_tag
def diff(a: str, b: str) -> SafeString:
    return diff_html(a, b)


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    try:
        return mapping.get(key)
    except AttributeError:
        return None
