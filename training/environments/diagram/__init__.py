"""Text-to-diagram environment: the policy turns a request into a JSON list of drawing actions.

Modules: `parsing` (reading a completion), `canvas` (the action schema, applying and rendering
actions as SVG), `rewards` (the four components and their replay variants), `prompts` (seed and
synthetic requests from requests.json, the split, rebuilding a stored prompt), `policy` (the
reference solution and the scripted noisy teacher) and `environment` (the `Environment` subclass
tying them together).

The names below stay importable from the package itself, so reward versions recorded before the
split ("training.environments.diagram:semantic_coverage") still resolve to the same functions.
"""

from .canvas import (
    CANVAS_H,
    CANVAS_W,
    MAX_ACTIONS,
    MAX_COORD,
    MAX_ID_LEN,
    MAX_LABEL_LEN,
    SHAPES,
    Analysis,
    Canvas,
    Edge,
    Shape,
    analyse,
    schema_error,
)
from .environment import DiagramEnvironment
from .parsing import Parsed, completion_text, normalise, parse_completion, slug, strip_fences
from .policy import ScriptedDiagramPolicy, render_actions, solve_actions
from .prompts import (
    FAMILIES,
    HOLDOUT_PERCENT,
    INSTRUCTION,
    SEED_REQUESTS,
    make_prompt,
    parse_graph,
    request_text,
    seed_prompts,
    split_of,
    stored_prompt,
    synthetic_prompt,
)
from .rewards import (
    COMPONENTS,
    REWARD_VARIANTS,
    json_valid,
    layout_quality,
    schema_valid,
    semantic_coverage,
)

__all__ = [
    "CANVAS_H",
    "CANVAS_W",
    "COMPONENTS",
    "FAMILIES",
    "HOLDOUT_PERCENT",
    "INSTRUCTION",
    "MAX_ACTIONS",
    "MAX_COORD",
    "MAX_ID_LEN",
    "MAX_LABEL_LEN",
    "REWARD_VARIANTS",
    "SEED_REQUESTS",
    "SHAPES",
    "Analysis",
    "Canvas",
    "DiagramEnvironment",
    "Edge",
    "Parsed",
    "ScriptedDiagramPolicy",
    "Shape",
    "analyse",
    "completion_text",
    "json_valid",
    "layout_quality",
    "make_prompt",
    "normalise",
    "parse_completion",
    "parse_graph",
    "render_actions",
    "request_text",
    "schema_error",
    "schema_valid",
    "seed_prompts",
    "semantic_coverage",
    "slug",
    "solve_actions",
    "split_of",
    "stored_prompt",
    "strip_fences",
    "synthetic_prompt",
]
