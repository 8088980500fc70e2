"""Reward components (pure functions of (prompt, completion) -> Score):

    json_valid         0.2  behavioural  list of objects 1 > other JSON 0.6 > malformed 0.1-0.5
                                         > prose 0
    schema_valid       0.2  behavioural  fraction of actions the canvas accepts
    semantic_coverage  1.0  outcome      mean(node recall, edge recall), each minus a mild
                                         extras penalty
    layout_quality     0.3  process      fraction of shapes inside the canvas, overlapping nothing

and the named parameter variants a reward replay can try without new code.
"""

from __future__ import annotations

import math
from typing import Any

from ..base import Component, Prompt, Score
from .canvas import analyse
from .parsing import completion_text, normalise


def json_valid(prompt: Prompt, completion: Any) -> Score:
    """Graded JSON well-formedness: prose 0 < malformed 0.1-0.5 < wrong type 0.6 < list 1.0.

    >>> json_valid(Prompt("k", "t", "train"), '```json\\n[{"action": "connect"}]\\n```').value
    1.0
    """
    parsed = analyse(completion_text(completion)).parsed
    return Score(parsed.json_value, parsed.reason)


def schema_valid(prompt: Prompt, completion: Any) -> Score:
    canvas = analyse(completion_text(completion)).canvas
    if canvas is None:
        return Score(0.0, "no JSON list of actions")
    if canvas.n_actions == 0:
        return Score(0.0, "empty action list")
    reason = f"{canvas.n_applied}/{canvas.n_actions} actions valid"
    if canvas.errors:
        reason += f"; first: {canvas.errors[0][:80]}"
    return Score(canvas.n_applied / canvas.n_actions, reason)


def semantic_coverage(
    prompt: Prompt, completion: Any, *, extra_penalty: float = 0.5, min_coverage: float = 0.0
) -> Score:
    """Node and edge recall minus `extra_penalty` times the share of extras; a value below
    `min_coverage` scores 0 (a stricter rule a reward replay can try without new code)."""
    nodes: list[str] = list(prompt.spec.get("nodes", []))
    edges = {(normalise(a), normalise(b)) for a, b in prompt.spec.get("edges", [])}
    if not nodes:
        return Score(math.nan, "prompt has no requested nodes")
    canvas = analyse(completion_text(completion)).canvas
    if canvas is None:
        return Score(0.0, f"0/{len(nodes)} nodes, 0/{len(edges)} edges (nothing parsed)")
    wanted = {normalise(n) for n in nodes}
    node_of: dict[str, str] = {}  # shape id -> requested node it stands for
    extra = 0
    for s in canvas.shapes.values():
        # Id first, then label: a shape stands for at most one node, and a second shape for an
        # already-drawn node is an extra (duplicates must not inflate recall).
        match = next((k for k in (normalise(s.id), normalise(s.label)) if k in wanted), None)
        if match is None or match in node_of.values():
            extra += 1
        else:
            node_of[s.id] = match
    drawn = {(node_of.get(e.src), node_of.get(e.dst)) for e in canvas.edges}
    edge_hits = len(edges & drawn)
    extra_edges = len(canvas.edges) - edge_hits
    # Extras cost a bounded, mild share (one stray among five ~0.08) so that spamming shapes, or
    # drawing every possible edge to harvest recall, scores below the honest answer.
    node_score = max(
        0.0, len(node_of) / len(wanted) - extra_penalty * extra / (extra + len(wanted))
    )
    value = node_score
    if edges:
        edge_score = edge_hits / len(edges) - extra_penalty * extra_edges / (
            extra_edges + len(edges)
        )
        value = (node_score + max(0.0, edge_score)) / 2
    reason = f"{len(node_of)}/{len(wanted)} nodes, {edge_hits}/{len(edges)} edges"
    if extra:
        reason += f", {extra} extra nodes"
    if extra_edges:
        reason += f", {extra_edges} extra edges"
    if value < min_coverage:
        return Score(0.0, f"{reason}; {value:.2f} below the {min_coverage:g} threshold")
    return Score(value, reason)


def layout_quality(prompt: Prompt, completion: Any) -> Score:
    canvas = analyse(completion_text(completion)).canvas
    if canvas is None or not canvas.shapes:
        return Score(0.0, "nothing drawn")
    overlapping, outside = canvas.layout_faults()
    n = len(canvas.shapes)
    clear = n - len(overlapping | outside)
    reason = (
        f"{clear}/{n} shapes clear; {len(overlapping)} overlapping, {len(outside)} out of bounds"
    )
    return Score(clear / n, reason)


# Named parameter variants of the components, registered for reward replay
# (training/reward_versions.py).
REWARD_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "semantic_coverage@strict": ("semantic_coverage", {"min_coverage": 0.8}),
    "semantic_coverage@no_extras": ("semantic_coverage", {"extra_penalty": 2.0}),
}

COMPONENTS: list[Component] = [
    Component(
        "json_valid", 0.2, json_valid, "behavioural", description="completion is a JSON list"
    ),
    Component(
        "schema_valid", 0.2, schema_valid, "behavioural", description="actions pass the schema"
    ),
    Component(
        "semantic_coverage",
        1.0,
        semantic_coverage,
        "outcome",
        description="requested nodes and directed edges are drawn",
    ),
    Component(
        "layout_quality",
        0.3,
        layout_quality,
        "process",
        description="shapes inside the canvas and not overlapping",
    ),
]
