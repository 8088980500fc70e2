"""Diagram runs for the replay tests: groups written through the ingestion service exactly as the
recorder sends them (every component scored by the environment itself, with its reason)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from training.environments import diagram

PROMPT = diagram.make_prompt(
    "diagram-pipeline-000001",
    "pipeline",
    "a CI pipeline",
    ["Build", "Test", "Deploy"],
    [["Build", "Test"], ["Test", "Deploy"]],
)
NODES = ["Build", "Test", "Deploy"]
EDGES = [("Build", "Test"), ("Test", "Deploy")]


def actions(nodes: list[str], edges: list[tuple[str, str]], stacked: bool = False) -> str:
    """A ```json answer: one column of boxes (or all on one spot: a layout fault),
    then the edges."""
    acts: list[dict[str, Any]] = [
        {
            "action": "create_shape",
            "id": n,
            "label": n,
            "shape": "rect",
            "x": 300,
            "y": 20 if stacked else 20 + 80 * i,
            "w": 200,
            "h": 50,
        }
        for i, n in enumerate(nodes)
    ]
    acts += [{"action": "connect", "from": a, "to": b} for a, b in edges]
    return "```json\n" + json.dumps(acts) + "\n```"


# Completions and their semantic_coverage under the deployed rule (0.5 extra penalty, no threshold).
FULL = actions(NODES, EDGES)  # 1.0
MISSING_EDGE = actions(NODES, EDGES[:1])  # 0.75
MISSING_NODE = actions(NODES[:2], EDGES[:1])  # (2/3 + 1/2) / 2 = 0.583
EXTRA_NODE = actions([*NODES, "Monitor"], EDGES)  # (1 - 0.5/4 + 1) / 2 = 0.9375
EDGE_SPAM = actions(NODES, list(itertools.permutations(NODES, 2)))  # (1 + 1 - 0.5*4/6) / 2 = 0.833
STACKED = actions(NODES, EDGES, stacked=True)  # coverage 1.0, layout 0
PROSE = "Sure! Here is your CI pipeline: Build, then Test, then Deploy."  # 0


def transcript(completion: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You draw diagrams."},
        {"role": "user", "content": PROMPT.text},
        {"role": "assistant", "content": completion},
    ]


def group_record(step: int, key: str, completions: list[str]) -> dict[str, Any]:
    env = diagram.DiagramEnvironment()
    rollouts = []
    for i, c in enumerate(completions):
        scores = env.score(PROMPT, c)
        rollouts.append(
            {
                "index": i,
                "transcript": transcript(c),
                "length": len(c.split()),
                "rewards": {k: {"value": s.value, "reason": s.reason} for k, s in scores.items()},
            }
        )
    return {
        "step": step,
        "key": key,
        "prompt": [{"role": "user", "content": PROMPT.text}],
        "rollouts": rollouts,
    }


def diagram_run(owner: Any = None, status: str = "succeeded"):
    from webapp.rollouts.services import create_run, environment_from_training

    env = environment_from_training(diagram.DiagramEnvironment())
    return create_run(
        name="diagram-run", kind="grpo", environment=env, config={}, owner=owner, status=status
    )


def ingest(run: Any, groups: list[dict[str, Any]]) -> None:
    from webapp.rollouts.ingest import ingest_groups

    ingest_groups(run, {"groups": groups})


def annotate(rollout_id: int, slug: str, author: Any) -> None:
    from webapp.annotations.models import Annotation, Label

    Annotation.objects.create(
        rollout_id=rollout_id, author=author, label=Label.objects.get(slug=slug)
    )
