"""The diagram reference solution (one column of boxes, every requested edge) and the scripted
noisy teacher built on it (demo data, teacher jobs with skill < 1)."""

from __future__ import annotations

import json
import math
import random
from typing import Any, ClassVar

from ..base import Prompt
from .canvas import CANVAS_H, CANVAS_W

# The reference layout is a single column of equal boxes: only `y` changes from shape to shape, so a
# small model can learn it. Diagrams too tall for one column fall back to a grid.
COLUMN_X, COLUMN_W, COLUMN_H, COLUMN_TOP, COLUMN_STEP = 300, 200, 50, 20, 80
COLUMN_MAX = (CANVAS_H - COLUMN_TOP - COLUMN_H) // COLUMN_STEP + 1  # 7 shapes fit


def solve_actions(prompt: Prompt) -> list[dict[str, Any]]:
    """A perfect action list: one shape per requested node, then every requested edge.

    Each shape's id is the node name itself, so a connect action repeats the names the request
    uses. Shapes form one column (x, w, h constant, y stepping by 80) when they fit, else a grid."""
    nodes: list[str] = prompt.spec["nodes"]
    if len(nodes) <= COLUMN_MAX:
        boxes = [
            (COLUMN_X, COLUMN_TOP + i * COLUMN_STEP, COLUMN_W, COLUMN_H) for i in range(len(nodes))
        ]
    else:
        cols = math.ceil(math.sqrt(len(nodes)))
        rows = math.ceil(len(nodes) / cols)
        cell_w, cell_h = CANVAS_W // cols, CANVAS_H // rows
        w, h = min(160, cell_w - 20), min(70, cell_h - 20)
        boxes = [
            (col * cell_w + (cell_w - w) // 2, row * cell_h + (cell_h - h) // 2, w, h)
            for row, col in (divmod(i, cols) for i in range(len(nodes)))
        ]
    actions: list[dict[str, Any]] = []
    for node, (x, y, w, h) in zip(nodes, boxes, strict=True):
        shape = (
            "diamond" if node.endswith("?") else "ellipse" if node in ("Start", "End") else "rect"
        )
        actions.append(
            {
                "action": "create_shape",
                "id": node,
                "label": node,
                "shape": shape,
                "x": x,
                "y": y,
                "w": w,
                "h": h,
            }
        )
    for a, b in prompt.spec["edges"]:
        actions.append({"action": "connect", "from": a, "to": b})
    return actions


def render_actions(actions: list[Any]) -> str:
    # Compact JSON, one action per line: readable in the rollout viewer and short in tokens.
    return "[\n" + ",\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n]"


class ScriptedDiagramPolicy:
    """The reference solution plus faults whose rates scale with (1 - skill).

    At skill 1 every sample is perfect (apart from an optional, harmless ```json fence); at skill 0
    most samples carry several faults. Rates are chosen so a group of 8 usually disagrees on some
    component yet often agrees on json_valid: the saturation the app is built to surface."""

    # fault -> rate at skill 0
    RATES: ClassVar[dict[str, float]] = {
        "prose": 0.12,
        "break_json": 0.2,
        "drop_node": 0.35,
        "drop_edge": 0.4,
        "extra_node": 0.15,
        "duplicate": 0.15,
        "bad_field": 0.2,
        "overlap": 0.35,
        "out_of_bounds": 0.25,
    }
    # Faults that only happen at a rate given in `faults` (never scaled by skill). omit_edges: a
    # lazy teacher that draws the shapes and forgets every connection; the answer stays valid JSON
    # and schema-correct, so a format filter keeps it and SFT learns the habit.
    HABITS: ClassVar[tuple[str, ...]] = ("omit_edges",)

    def __init__(
        self, seed: int = 0, skill: float = 0.5, faults: dict[str, float] | None = None
    ) -> None:
        self.rng = random.Random(seed)
        self.skill = skill
        self.faults = self.check_faults(faults or {})

    @classmethod
    def check_faults(cls, faults: dict[str, float], field: str = "faults") -> dict[str, float]:
        """Fixed per-sample fault probabilities; a ValueError names the bad entry."""
        known = (*cls.RATES, *cls.HABITS)
        out = {}
        for name, rate in faults.items():
            if name not in known:
                raise ValueError(f"{field}: unknown fault {name!r} (known: {', '.join(known)})")
            if (
                isinstance(rate, bool)
                or not isinstance(rate, (int, float))
                or not 0.0 <= rate <= 1.0
            ):
                raise ValueError(f"{field}: {name} must be a probability in [0, 1], got {rate!r}")
            out[name] = float(rate)
        return out

    def _hit(self, rng: random.Random, fault: str) -> bool:
        if fault in self.faults:
            return rng.random() < self.faults[fault]
        return rng.random() < self.RATES[fault] * (1.0 - min(max(self.skill, 0.0), 1.0))

    def sample(self, prompt: Prompt, rng: random.Random | None = None) -> str:
        rng = rng or self.rng
        if self._hit(rng, "prose"):
            nodes = prompt.spec["nodes"]
            return f"Sure! I would draw {', '.join(nodes)} as boxes and connect them with arrows."
        # The faults are drawn in a fixed order: a seeded policy writes the same answers.
        actions = self._drop_parts(rng, solve_actions(prompt))
        self._add_and_move_shapes(rng, actions)
        self._bad_field(rng, actions)
        text = self._break_json(rng, render_actions(actions))
        if rng.random() < 0.2:  # fences are tolerated: cosmetic variety, never a fault
            text = f"```json\n{text}\n```"
        return text

    def _drop_parts(
        self, rng: random.Random, actions: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """drop_node, omit_edges, drop_edge: a node or edges the request asks for go missing."""
        shapes = [a for a in actions if a["action"] == "create_shape"]
        if self._hit(rng, "drop_node") and len(shapes) > 1:
            victim = rng.choice(shapes)
            actions.remove(victim)
            if rng.random() < 0.5:  # also drop its edges; otherwise they dangle (schema errors)
                actions = [a for a in actions if victim["id"] not in (a.get("from"), a.get("to"))]
        if self.faults.get("omit_edges") and self._hit(
            rng, "omit_edges"
        ):  # no draw unless asked for
            actions = [a for a in actions if a["action"] != "connect"]
        edges = [a for a in actions if a["action"] == "connect"]
        if self._hit(rng, "drop_edge") and edges:
            actions.remove(rng.choice(edges))
        return actions

    def _add_and_move_shapes(self, rng: random.Random, actions: list[dict[str, Any]]) -> None:
        """extra_node, duplicate, overlap, out_of_bounds: shapes added or moved, in place."""
        shapes = [a for a in actions if a["action"] == "create_shape"]
        if self._hit(rng, "extra_node"):
            actions.insert(
                len(shapes),
                {
                    "action": "create_shape",
                    "id": "note",
                    "label": "Note",
                    "shape": "rect",
                    "x": 10,
                    "y": 10,
                    "w": 60,
                    "h": 30,
                },
            )
        if self._hit(rng, "duplicate") and shapes:
            copy = dict(rng.choice(shapes))
            if rng.random() < 0.5:  # same id: a schema error; fresh id: an extra, overlapping node
                copy["id"] += "_2"
            actions.insert(len(shapes), copy)
        if self._hit(rng, "overlap") and len(shapes) > 1:
            a, b = rng.sample(shapes, 2)
            a["x"], a["y"] = b["x"] + rng.randint(-20, 20), b["y"] + rng.randint(-10, 10)
        if self._hit(rng, "out_of_bounds") and shapes:
            s = rng.choice(shapes)
            s["x"] = CANVAS_W - s["w"] // 2

    def _bad_field(self, rng: random.Random, actions: list[dict[str, Any]]) -> None:
        """bad_field: one action with a renamed key, a string coordinate or an unknown shape."""
        if self._hit(rng, "bad_field") and actions:
            i = rng.randrange(len(actions))
            a = dict(actions[i])  # a copy: a duplicated shape must not change with its original
            fault = rng.choice(["rename", "string_int", "bad_shape"])
            if fault != "rename" and a["action"] == "create_shape":
                a.update({"x": str(a["x"])} if fault == "string_int" else {"shape": "circle"})
            else:
                a["type"] = a.pop("action")
            actions[i] = a

    def _break_json(self, rng: random.Random, text: str) -> str:
        """break_json: the answer truncated, missing its closing bracket or with
        a trailing comma."""
        if self._hit(rng, "break_json"):
            how = rng.choice(["truncate", "drop_bracket", "trailing_comma"])
            if how == "truncate":
                text = text[: rng.randint(len(text) // 3, len(text) - 2)]
            elif how == "drop_bracket":
                text = text[:-1]
            else:
                text = text[:-2] + ",\n]"
        return text
