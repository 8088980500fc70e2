"""Diagram prompts: hand-written seed requests plus template-generated synthetic ones, the
train/holdout split (a hash of the request) and the rebuilding of a stored group's prompt."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from pathlib import Path
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


# Hand-written seed requests (slug, family, title, graph: five families, three each) and the
# vocabulary of the synthetic ones, shipped in the wheel (pyproject package-data).
_DATA = json.loads(Path(__file__).with_name("requests.json").read_text(encoding="utf-8"))
SEED_REQUESTS: list[tuple[str, str, str, str]] = [tuple(r) for r in _DATA["seed_requests"]]

FAMILIES = ("pipeline", "org_chart", "state_machine", "architecture", "flowchart")

_PIPELINES: dict[str, list[str]] = _DATA["pipelines"]  # stages in order; a prompt keeps a subset
_ORG_ROOTS: list[str] = _DATA["org_roots"]
_ORG_MIDS: list[str] = _DATA["org_mids"]
_ORG_LEAVES: list[str] = _DATA["org_leaves"]
_STATE_MACHINES: dict[str, list] = _DATA["state_machines"]  # title -> [states in order, sink]
_ARCH_CLIENTS: list[str] = _DATA["arch_clients"]
_ARCH_ENTRIES: list[str] = _DATA["arch_entries"]
_ARCH_SERVICES: list[str] = _DATA["arch_services"]
_ARCH_BACKENDS: list[str] = _DATA["arch_backends"]
_FLOWS: list[list[str]] = _DATA["flows"]  # [title, "step,step,question,yes step,no step"]


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
