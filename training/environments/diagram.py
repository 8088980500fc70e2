"""Text-to-diagram environment: the policy turns a request into a JSON list of drawing actions.

Action schema (the completion is one JSON list, optionally inside a ```json fence):

    {"action": "create_shape", "id": str, "label": str, "shape": "rect"|"ellipse"|"diamond",
     "x": int, "y": int, "w": int, "h": int}      # top-left corner and size, canvas 800x600
    {"action": "connect", "from": id, "to": id, "label": str (optional)}

Unknown extra fields are ignored. `Canvas` applies actions in order and records an error (never
raises) for: not an object, unknown action, missing/mistyped field, duplicate id, duplicate edge,
connect to an id not created before. It renders SVG itself from validated ints and escaped text.

Reward components (pure functions of (prompt, completion) -> Score):
    json_valid         0.2  behavioural  list of objects 1 > other JSON 0.6 > malformed 0.1-0.5
                                         > prose 0
    schema_valid       0.2  behavioural  fraction of actions the canvas accepts
    semantic_coverage  1.0  outcome      mean(node recall, edge recall), each minus a mild
                                         extras penalty
    layout_quality     0.3  process      fraction of shapes inside the canvas, overlapping nothing
"""

from __future__ import annotations

import functools
import hashlib
import html
import itertools
import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Component, Environment, Prompt, Score, Split

CANVAS_W = 800
CANVAS_H = 600
SHAPES = ("rect", "ellipse", "diamond")
MAX_ACTIONS = 200  # hostile completions may hold thousands; the canvas refuses the rest
MAX_ID_LEN = 64
MAX_LABEL_LEN = 200
MAX_COORD = 100_000  # keeps SVG numbers sane; out-of-canvas values are a layout fault, not schema
HOLDOUT_PERCENT = 20

INSTRUCTION = (
    "Reply with only a JSON list of actions for an 800x600 canvas:\n"
    '{"action":"create_shape","id":ID,"label":TEXT,"shape":"rect"|"ellipse"|"diamond",'
    '"x":INT,"y":INT,"w":INT,"h":INT}\n'
    '{"action":"connect","from":ID,"to":ID}\n'
    "Shapes must not overlap and must stay inside the canvas."
)

_FENCE_RE = re.compile(r"```[A-Za-z]*[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)
_NORM_RE = re.compile(r"[^a-z0-9]+")
# XML 1.0 forbids these even escaped; a label carrying them would make the SVG unparseable.
_XML_BAD_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def normalise(text: str) -> str:
    """Case- and punctuation-insensitive form used to match shapes to requested nodes."""
    return _NORM_RE.sub("", text.lower())


def slug(text: str) -> str:
    return _NORM_RE.sub("_", text.lower()).strip("_")


# ---------------------------------------------------------------------------------------------
# Parsing


def completion_text(completion: Any) -> str:
    """The text to grade: a str as is, or the last assistant message of a chat transcript."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role") == "assistant":
                return _content_text(message.get("content"))
        return ""
    return str(completion)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal-style parts: [{"type": "text", "text": ...}]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def strip_fences(text: str) -> str:
    """Inner text of the first ``` fence (tolerating a truncated, unclosed one), else the text."""
    match = _FENCE_RE.search(text)
    return (match.group(1) if match else text).strip()


@dataclass(frozen=True)
class Parsed:
    """Outcome of parsing one completion; `actions` is set only for a top-level JSON list."""

    json_value: float
    reason: str
    actions: list[Any] | None


def parse_completion(text: str) -> Parsed:
    body = strip_fences(text)
    if not body:
        return Parsed(0.0, "empty completion", None)
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        if body[0] not in "[{":
            return Parsed(0.0, "not JSON: starts with prose", None)
        # Partial credit grows with how far the parser got: a truncated list scores near 0.5,
        # garbage right after the bracket near 0.1; both stay below any parseable JSON (0.6).
        pos = getattr(exc, "pos", 0)
        msg = getattr(exc, "msg", "too deeply nested")
        return Parsed(0.1 + 0.4 * pos / len(body), f"JSON parse error at char {pos}: {msg}", None)
    if isinstance(data, list) and all(isinstance(a, dict) for a in data):
        return Parsed(1.0, f"valid JSON list of {len(data)} actions", data)
    if isinstance(data, list):
        return Parsed(0.6, "valid JSON list but some items are not objects", data)
    return Parsed(0.6, f"valid JSON but top level is {type(data).__name__}, not list", None)


# ---------------------------------------------------------------------------------------------
# Canvas


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


# ---------------------------------------------------------------------------------------------
# Reward components


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


# ---------------------------------------------------------------------------------------------
# Prompts: hand-written seeds plus template-generated synthetic requests


def _chain(nodes: list[str]) -> list[list[str]]:
    return [[a, b] for a, b in itertools.pairwise(nodes)]


def parse_graph(text: str) -> tuple[list[str], list[list[str]]]:
    """ "A > B > C; A > D" -> nodes in order of first appearance, and the directed edges."""
    nodes: list[str] = []
    edges: list[list[str]] = []
    for chain in text.split(";"):
        names = [n.strip() for n in chain.split(">")]
        nodes += [n for n in dict.fromkeys(names) if n not in nodes]  # a cycle names a node twice
        edges += _chain(names)
    return nodes, edges


# (slug, family, title, graph): five families, three each
SEED_REQUESTS: list[tuple[str, str, str, str]] = [
    ("ci-pipeline", "pipeline", "a CI pipeline", "Build > Test > Deploy"),
    ("data-pipeline", "pipeline", "a data pipeline", "Ingest > Validate > Transform > Load"),
    ("ml-pipeline", "pipeline", "an ML pipeline", "Collect data > Train > Evaluate > Serve"),
    ("startup-org", "org_chart", "a startup org chart", "CEO > CTO > Engineer; CEO > CFO"),
    (
        "school-org",
        "org_chart",
        "a school org chart",
        "Principal > Vice principal > Teacher; Principal > Secretary",
    ),
    (
        "hospital-org",
        "org_chart",
        "a hospital org chart",
        "Director > Head nurse > Nurse; Director > Chief surgeon",
    ),
    (
        "traffic-light",
        "state_machine",
        "a traffic light state machine",
        "Red > Green > Yellow > Red",
    ),
    (
        "order-lifecycle",
        "state_machine",
        "an order lifecycle",
        "Created > Paid > Shipped > Delivered; Created > Cancelled",
    ),
    (
        "door-states",
        "state_machine",
        "door states",
        "Open > Closed > Open; Closed > Locked > Closed",
    ),
    (
        "web-app",
        "architecture",
        "a web app architecture",
        "Browser > Load balancer > Web server > Database; Web server > Cache",
    ),
    (
        "event-system",
        "architecture",
        "an event-driven system",
        "Producer > Queue > Consumer > Database",
    ),
    (
        "microservices",
        "architecture",
        "a microservice architecture",
        "Client > API gateway > User service; API gateway > Order service > Payment service",
    ),
    (
        "login-flow",
        "flowchart",
        "a login flowchart",
        "Start > Enter password > Password correct? > Show dashboard; Password correct? > Enter "
        "password",
    ),
    (
        "coffee-flow",
        "flowchart",
        "a coffee-making flowchart",
        "Start > Water hot? > Brew coffee > End; Water hot? > Heat water > Brew coffee",
    ),
    (
        "bug-triage",
        "flowchart",
        "a bug triage flowchart",
        "Bug report > Reproducible? > Fix bug > Close ticket; Reproducible? > Ask for details",
    ),
]

FAMILIES = ("pipeline", "org_chart", "state_machine", "architecture", "flowchart")

_PIPELINES = {  # stages in pipeline order; a prompt keeps an ordered subset
    "a CI pipeline": [
        "Checkout",
        "Build",
        "Lint",
        "Unit tests",
        "Package",
        "Deploy staging",
        "Smoke test",
        "Release",
    ],
    "a data pipeline": [
        "Extract",
        "Validate",
        "Clean",
        "Transform",
        "Join",
        "Aggregate",
        "Load",
        "Report",
    ],
    "an ML pipeline": [
        "Collect data",
        "Label",
        "Split",
        "Train",
        "Evaluate",
        "Register",
        "Serve",
        "Monitor",
    ],
    "a publishing workflow": [
        "Draft",
        "Edit",
        "Review",
        "Approve",
        "Schedule",
        "Publish",
        "Promote",
    ],
    "a hiring process": [
        "Apply",
        "Screen",
        "Phone call",
        "Interview",
        "Reference check",
        "Offer",
        "Onboard",
    ],
}
_ORG_ROOTS = ["CEO", "Founder", "Director", "Principal", "Mayor", "Head chef"]
_ORG_MIDS = [
    "CTO",
    "CFO",
    "COO",
    "VP Sales",
    "VP Engineering",
    "Head of Design",
    "Head of HR",
    "Deputy",
]
_ORG_LEAVES = [
    "Engineer",
    "Accountant",
    "Designer",
    "Recruiter",
    "Analyst",
    "Sales rep",
    "Assistant",
    "Intern",
]
_STATE_MACHINES = {
    "an order lifecycle": (["Created", "Paid", "Packed", "Shipped", "Delivered"], "Cancelled"),
    "a ticket workflow": (["New", "Triaged", "In progress", "In review", "Done"], "Rejected"),
    "a media player": (["Stopped", "Loading", "Playing", "Paused"], "Error"),
    "a TCP connection": (["Closed", "Listen", "Syn received", "Established", "Closing"], "Reset"),
    "a vending machine": (["Idle", "Coin inserted", "Item selected", "Dispensing"], "Refund"),
}
_ARCH_CLIENTS = ["Browser", "Mobile app", "CLI"]
_ARCH_ENTRIES = ["Load balancer", "API gateway", "CDN"]
_ARCH_SERVICES = ["API server", "Web server", "App server"]
_ARCH_BACKENDS = ["Database", "Cache", "Queue", "Object store", "Search index", "Auth service"]
_FLOWS = [  # (title, "step,step,question,yes step,no step")
    ("a password reset flowchart", "Request reset,Send email,Link valid?,Set password,Show error"),
    ("a checkout flowchart", "Add to cart,Enter address,Payment ok?,Confirm order,Retry payment"),
    ("a deploy flowchart", "Merge PR,Run tests,Tests pass?,Deploy,Notify author"),
    ("a support flowchart", "Receive ticket,Read ticket,Known issue?,Send answer,Escalate"),
    ("a cooking flowchart", "Boil water,Add pasta,Pasta soft?,Drain pasta,Wait a minute"),
    ("a signup flowchart", "Open form,Fill details,Email unique?,Create account,Ask new email"),
    ("a loan flowchart", "Submit application,Check credit,Score high?,Approve loan,Decline loan"),
    ("a refund flowchart", "Receive return,Inspect item,Item damaged?,Reject refund,Issue refund"),
]


def _synth_pipeline(rng: random.Random) -> tuple[str, list[str], list[list[str]]]:
    title = rng.choice(sorted(_PIPELINES))
    stages = _PIPELINES[title]
    nodes = [stages[i] for i in sorted(rng.sample(range(len(stages)), rng.randint(3, 6)))]
    return title, nodes, _chain(nodes)


def _synth_org_chart(rng: random.Random) -> tuple[str, list[str], list[list[str]]]:
    root = rng.choice(_ORG_ROOTS)
    mids = rng.sample(_ORG_MIDS, rng.randint(2, 3))
    leaves = rng.sample(_ORG_LEAVES, rng.randint(1, 3))
    edges = [[root, m] for m in mids] + [[rng.choice(mids), leaf] for leaf in leaves]
    return f"an org chart under the {root}", [root, *mids, *leaves], edges


def _synth_state_machine(rng: random.Random) -> tuple[str, list[str], list[list[str]]]:
    title = rng.choice(sorted(_STATE_MACHINES))
    states, sink = _STATE_MACHINES[title]
    nodes = states[: rng.randint(3, len(states))]
    edges = _chain(nodes)
    if rng.random() < 0.5:
        edges.append([nodes[-1], nodes[0]])
    if rng.random() < 0.5:
        edges.append([rng.choice(nodes[:-1]), sink])
        nodes = [*nodes, sink]
    return title, nodes, edges


def _synth_architecture(rng: random.Random) -> tuple[str, list[str], list[list[str]]]:
    front = [rng.choice(_ARCH_CLIENTS), rng.choice(_ARCH_ENTRIES), rng.choice(_ARCH_SERVICES)]
    backends = rng.sample(_ARCH_BACKENDS, rng.randint(1, 3))
    edges = _chain(front) + [[front[-1], b] for b in backends]
    nodes = front + backends
    if "Queue" in backends:
        nodes.append("Worker")
        edges.append(["Queue", "Worker"])
    return f"a system where a {front[0]} calls a {front[2]}", nodes, edges


def _synth_flowchart(rng: random.Random) -> tuple[str, list[str], list[list[str]]]:
    title, names = rng.choice(_FLOWS)
    *steps, question, yes, no = names.split(",")
    steps = steps[: rng.randint(1, len(steps))]
    nodes = ["Start", *steps, question, yes, no, "End"]
    edges = _chain(["Start", *steps, question, yes, "End"]) + [[question, no]]
    edges.append([no, rng.choice([steps[0], "End"])])
    return title, nodes, edges


_SYNTH = {
    "pipeline": _synth_pipeline,
    "org_chart": _synth_org_chart,
    "state_machine": _synth_state_machine,
    "architecture": _synth_architecture,
    "flowchart": _synth_flowchart,
}


def request_text(title: str, nodes: list[str], edges: list[list[str]]) -> str:
    edge_text = ", ".join(f"{a}->{b}" for a, b in edges)
    return f"Draw {title}. Nodes: {', '.join(nodes)}. Edges: {edge_text}."


def split_of(request: str) -> Split:
    """Split by a hash of the request (not the key), so identical content never lands in both."""
    bucket = int.from_bytes(hashlib.sha256(request.encode()).digest()[:4], "big") % 100
    return "holdout" if bucket < HOLDOUT_PERCENT else "train"


def make_prompt(
    key: str, family: str, title: str, nodes: list[str], edges: list[list[str]]
) -> Prompt:
    request = request_text(title, nodes, edges)
    spec = {"family": family, "nodes": list(nodes), "edges": [list(e) for e in edges]}
    return Prompt(
        key=key, text=f"{INSTRUCTION}\nRequest: {request}", split=split_of(request), spec=spec
    )


def seed_prompts() -> list[Prompt]:
    return [make_prompt(f"diagram-seed-{s}", f, t, *parse_graph(g)) for s, f, t, g in SEED_REQUESTS]


def synthetic_prompt(index: int) -> Prompt:
    """The index-th synthetic prompt; a pure function of `index`, so its key is stable."""
    family = FAMILIES[index % len(FAMILIES)]
    rng = random.Random(
        f"diagram-syn-{index}"
    )  # str seeds are hashed with sha512: stable across runs
    title, nodes, edges = _SYNTH[family](rng)
    return make_prompt(
        f"diagram-{family.replace('_', '-')}-{index:06d}", family, title, nodes, edges
    )


# ---------------------------------------------------------------------------------------------
# Reference solution


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


# ---------------------------------------------------------------------------------------------
# Environment


class DiagramEnvironment(Environment):
    name = "diagram"
    description = "Turn a diagram request into a JSON list of create_shape / connect actions."

    def __init__(self) -> None:
        self.components: list[Component] = list(COMPONENTS)
        self._seeds = seed_prompts()

    def prompts(
        self, split: Split, n: int, seed: int = 0, max_nodes: int | None = None
    ) -> list[Prompt]:
        """n prompts of `split`: the seed set (shuffled by `seed`) then synthetic ones.

        `max_nodes` keeps only requests with at most that many nodes (small diagrams: shorter
        answers, an easier task for a tiny model). Deterministic in (split, n, seed, max_nodes), and
        a smaller n gives a prefix of a larger one."""
        if max_nodes is not None and max_nodes < 3:
            raise ValueError("max_nodes: must be >= 3 (the smallest requests have 3 nodes)")

        def fits(p: Prompt) -> bool:
            return max_nodes is None or len(p.spec["nodes"]) <= max_nodes

        out = [p for p in self._seeds if p.split == split and fits(p)]
        random.Random(seed).shuffle(out)
        seen = {p.text for p in self._seeds}
        start = index = seed * 100_000  # different seeds read different stretches of the stream
        while len(out) < n:
            if (
                index - start > 100 * n + 10_000
            ):  # the templates hold a few thousand distinct prompts
                raise ValueError(
                    f"only {len(out)} distinct {split} prompts available, asked for {n}"
                )
            p = synthetic_prompt(index)
            index += 1
            if p.split == split and p.text not in seen and fits(p):
                seen.add(p.text)
                out.append(p)
        return out[:n]

    def state(self, prompt: Prompt, completion: Any) -> dict[str, Any]:
        canvas = analyse(completion_text(completion)).canvas or Canvas()
        return {
            "svg": canvas.to_svg(),
            "errors": canvas.errors[:20],
            "n_shapes": len(canvas.shapes),
        }

    def solve(self, prompt: Prompt) -> str:
        return render_actions(solve_actions(prompt))

    def scripted_policy(
        self, seed: int = 0, skill: float = 1.0, faults: dict[str, float] | None = None
    ) -> ScriptedDiagramPolicy:
        return ScriptedDiagramPolicy(seed=seed, skill=skill, faults=faults)

    def reward_variants(self) -> dict[str, tuple[str, dict[str, Any]]]:
        return REWARD_VARIANTS

    def stored_prompt(self, key: str, prompt: Any) -> Prompt | None:
        return stored_prompt(key, prompt)

    # Eval jobs: named yes/no properties of an answer whose share the eval
    # reports beside the reward. "Answers without connections" is the demo chain's habit: a
    # request that asks for connections, answered with none drawn (parsed or not).

    def eval_checks(self, prompt: Prompt, completion: Any) -> dict[str, bool]:
        if not prompt.spec.get("edges"):
            return {}
        canvas = analyse(completion_text(completion)).canvas
        return {"answers without connections": canvas is None or not canvas.edges}


# ---------------------------------------------------------------------------------------------
# Scripted noisy teacher


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


_REQUEST_RE = re.compile(
    r"Request: Draw (?P<title>.*?)\. Nodes: (?P<nodes>.*?)\. Edges: (?P<edges>.*)\.\s*$", re.DOTALL
)


def stored_prompt(key: str, prompt: Any) -> Prompt | None:
    """The Prompt (with its hidden spec) of a stored group, rebuilt from the request line
    the policy saw; None when the text is not a request of this environment (a replay then
    fails those rollouts)."""
    text = (
        prompt
        if isinstance(prompt, str)
        else completion_text(
            [
                dict(m, role="assistant")
                for m in prompt
                if isinstance(m, dict) and m.get("role") == "user"
            ]
            if isinstance(prompt, list)
            else None
        )
    )
    match = _REQUEST_RE.search(text or "")
    if match is None:
        return None
    nodes = [n for n in match["nodes"].split(", ") if n]
    edges = [e.split("->", 1) for e in match["edges"].split(", ") if "->" in e]
    seeds = {f"diagram-seed-{slug}": fam for slug, fam, _, _ in SEED_REQUESTS}
    family = seeds.get(key) or next(
        (f for f in FAMILIES if key.startswith(f"diagram-{f.replace('_', '-')}-")), ""
    )
    return Prompt(
        key=key,
        text=text,
        split=split_of(match.group(0)[len("Request: ") :].strip()),
        spec={"family": family, "nodes": nodes, "edges": edges},
    )
