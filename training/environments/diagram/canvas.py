"""The 800x600 canvas a diagram completion draws on.

Action schema (the completion is one JSON list, optionally inside a ```json fence):

    {"action": "create_shape", "id": str, "label": str, "shape": "rect"|"ellipse"|"diamond",
     "x": int, "y": int, "w": int, "h": int}      # top-left corner and size, canvas 800x600
    {"action": "connect", "from": id, "to": id, "label": str (optional)}

Unknown extra fields are ignored. `Canvas` applies actions in order and records an error (never
raises) for: not an object, unknown action, missing/mistyped field, duplicate id, duplicate edge,
connect to an id not created before. It renders SVG itself from validated ints and escaped text.
"""

from __future__ import annotations

import functools
import html
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .parsing import Parsed, parse_completion

CANVAS_W = 800
CANVAS_H = 600
SHAPES = ("rect", "ellipse", "diamond")
MAX_ACTIONS = 200  # hostile completions may hold thousands; the canvas refuses the rest
MAX_ID_LEN = 64
MAX_LABEL_LEN = 200
MAX_COORD = 100_000  # keeps SVG numbers sane; out-of-canvas values are a layout fault, not schema
# XML 1.0 forbids these even escaped; a label carrying them would make the SVG unparseable.
_XML_BAD_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


@dataclass(frozen=True)
class Shape:
    id: str
    label: str
    shape: str
    x: int
    y: int
    w: int
    h: int

    @property
    def center(self) -> tuple[float, float]:
        return self.x + self.w / 2, self.y + self.h / 2

    def overlaps(self, other: Shape) -> bool:
        # Touching edges is fine: only a positive-area intersection counts.
        return (
            self.x < other.x + other.w
            and other.x < self.x + self.w
            and self.y < other.y + other.h
            and other.y < self.y + self.h
        )

    def inside(self, width: int, height: int) -> bool:
        return (
            self.x >= 0 and self.y >= 0 and self.x + self.w <= width and self.y + self.h <= height
        )


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    label: str = ""


def _check_str(action: dict[str, Any], key: str, max_len: int, required: bool = True) -> str | None:
    if key not in action:
        return f"missing field '{key}'" if required else None
    value = action[key]
    if not isinstance(value, str) or (required and not value.strip()):
        return f"'{key}' must be a non-empty string" if required else f"'{key}' must be a string"
    if len(value) > max_len:
        return f"'{key}' longer than {max_len} chars"
    return None


def _check_int(action: dict[str, Any], key: str, low: int) -> str | None:
    if key not in action:
        return f"missing field '{key}'"
    value = action[key]
    if type(value) is not int:  # bool is an int subclass; "10" and 10.5 are not ints either
        return f"'{key}' must be an integer"
    if not low <= value <= MAX_COORD:
        return f"'{key}' out of range [{low}, {MAX_COORD}]"
    return None


def schema_error(action: Any) -> str | None:
    """Stateless schema check of one action; None when it is well formed."""
    if not isinstance(action, dict):
        return "not an object"
    kind = action.get("action")
    if kind == "create_shape":
        checks = [_check_str(action, "id", MAX_ID_LEN), _check_str(action, "label", MAX_LABEL_LEN)]
        if action.get("shape") not in SHAPES:
            checks.append(f"'shape' must be one of {'/'.join(SHAPES)}")
        checks += [_check_int(action, k, -MAX_COORD) for k in ("x", "y")]
        checks += [_check_int(action, k, 1) for k in ("w", "h")]
    elif kind == "connect":
        checks = [_check_str(action, "from", MAX_ID_LEN), _check_str(action, "to", MAX_ID_LEN)]
        checks.append(_check_str(action, "label", MAX_LABEL_LEN, required=False))
    else:
        return f"unknown action {str(kind)[:40]!r}"
    return next((c for c in checks if c), None)


@dataclass
class Canvas:
    """Applies actions in order; invalid ones are recorded in `errors` and skipped."""

    width: int = CANVAS_W
    height: int = CANVAS_H
    shapes: dict[str, Shape] = field(default_factory=dict)  # insertion order = drawing order
    edges: list[Edge] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    n_actions: int = 0
    n_applied: int = 0

    def apply(self, action: Any) -> bool:
        index = self.n_actions
        self.n_actions += 1
        error = self._error(action, index)
        if error:
            self.errors.append(f"action {index}: {error}")
            return False
        if action["action"] == "create_shape":
            self.shapes[action["id"]] = Shape(
                action["id"],
                action["label"],
                action["shape"],
                action["x"],
                action["y"],
                action["w"],
                action["h"],
            )
        else:
            self.edges.append(Edge(action["from"], action["to"], action.get("label", "")))
        self.n_applied += 1
        return True

    def apply_all(self, actions: list[Any]) -> Canvas:
        for action in actions:
            self.apply(action)
        return self

    def _error(self, action: Any, index: int) -> str | None:
        if index >= MAX_ACTIONS:
            return f"more than {MAX_ACTIONS} actions"
        error = schema_error(action)
        if error:
            return error
        if action["action"] == "create_shape":
            return f"duplicate id {action['id']!r}" if action["id"] in self.shapes else None
        for end in ("from", "to"):
            if action[end] not in self.shapes:
                return f"connect to unknown id {action[end]!r}"
        if any(e.src == action["from"] and e.dst == action["to"] for e in self.edges):
            return f"duplicate edge {action['from']!r}->{action['to']!r}"
        return None

    def layout_faults(self) -> tuple[set[str], set[str]]:
        """(ids overlapping another shape, ids not fully inside the canvas)."""
        shapes = list(self.shapes.values())
        overlapping: set[str] = set()
        for i, a in enumerate(shapes):
            for b in shapes[i + 1 :]:
                if a.overlaps(b):
                    overlapping.update((a.id, b.id))
        outside = {s.id for s in shapes if not s.inside(self.width, self.height)}
        return overlapping, outside

    def to_svg(self) -> str:
        """SVG from validated ints and escaped text only: model output never reaches markup."""
        parts = [
            (
                f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" '
                'font-family="sans-serif" font-size="14">'
            ),
            (
                '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
                'markerHeight="8" orient="auto"><path d="M0,0 L10,5 L0,10 z" '
                'fill="#444"/></marker></defs>'
            ),
            f'<rect x="0" y="0" width="{self.width}" height="{self.height}" fill="#fff" '
            'stroke="#ccc"/>',
        ]
        for edge in self.edges:
            parts.append(self._edge_svg(edge))
        for s in self.shapes.values():
            parts.append(_shape_svg(s))
        parts.append("</svg>")
        return "".join(parts)

    def _edge_svg(self, edge: Edge) -> str:
        a, b = self.shapes[edge.src], self.shapes[edge.dst]
        (x1, y1), (x2, y2) = a.center, b.center
        # Stop the arrow at the target's bounding box so the head is not hidden under the shape.
        dx, dy = x2 - x1, y2 - y1
        if dx or dy:
            t = min(b.w / 2 / abs(dx) if dx else math.inf, b.h / 2 / abs(dy) if dy else math.inf)
            x2, y2 = x2 - dx * min(t, 1.0), y2 - dy * min(t, 1.0)
        line = (
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="#444" '
            f'stroke-width="1.5" marker-end="url(#arrow)"/>'
        )
        if not edge.label:
            return line
        mx, my = (x1 + x2) / 2, (y1 + y2) / 2 - 4
        text = (
            f'<text x="{mx:.1f}" y="{my:.1f}" text-anchor="middle" '
            f'fill="#444">{_esc(edge.label)}</text>'
        )
        return line + text


def _esc(text: str) -> str:
    return html.escape(_XML_BAD_RE.sub("", text), quote=True)


def _shape_svg(s: Shape) -> str:
    cx, cy = s.center
    style = 'fill="#eef4ff" stroke="#246" stroke-width="1.5"'
    if s.shape == "ellipse":
        body = (
            f'<ellipse cx="{cx:.1f}" cy="{cy:.1f}" rx="{s.w / 2:.1f}" ry="{s.h / 2:.1f}" {style}/>'
        )
    elif s.shape == "diamond":
        points = f"{cx:.1f},{s.y} {s.x + s.w},{cy:.1f} {cx:.1f},{s.y + s.h} {s.x},{cy:.1f}"
        body = f'<polygon points="{points}" {style}/>'
    else:
        body = f'<rect x="{s.x}" y="{s.y}" width="{s.w}" height="{s.h}" rx="4" {style}/>'
    label = (
        f'<text x="{cx:.1f}" y="{cy + 5:.1f}" text-anchor="middle" '
        f'fill="#123">{_esc(s.label)}</text>'
    )
    return body + label


@dataclass(frozen=True)
class Analysis:
    parsed: Parsed
    canvas: Canvas | None  # None when there is no list of actions; treat as read-only (cached)


@functools.lru_cache(maxsize=4096)
def analyse(text: str) -> Analysis:
    """Parse and apply once per distinct completion: the four components share this work."""
    parsed = parse_completion(text)
    if parsed.actions is None:
        return Analysis(parsed, None)
    return Analysis(parsed, Canvas().apply_all(parsed.actions))
