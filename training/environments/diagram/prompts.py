"""Diagram prompts: hand-written seed requests plus template-generated synthetic ones, the
train/holdout split (a hash of the request) and the rebuilding of a stored group's prompt."""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from typing import Any

from ..base import Prompt, Split
from .parsing import completion_text

HOLDOUT_PERCENT = 20

INSTRUCTION = (
    "Reply with only a JSON list of actions for an 800x600 canvas:\n"
    '{"action":"create_shape","id":ID,"label":TEXT,"shape":"rect"|"ellipse"|"diamond",'
    '"x":INT,"y":INT,"w":INT,"h":INT}\n'
    '{"action":"connect","from":ID,"to":ID}\n'
    "Shapes must not overlap and must stay inside the canvas."
)


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
