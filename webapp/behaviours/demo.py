"""The demo's behaviour story (seed_demo): the annotator's labelled hacks on the diagram run (the
extra-shape winners) become a behaviour through "find more like this"; its rate and onset show on
the diagram run's dashboard, and on a scripted twin whose policy stops drawing extra shapes halfway
(what a policy trained on the fixed reward should do; scripted, not trained, and its config says
so) the rate falls. Idempotent: a re-run finds both."""

from __future__ import annotations

from typing import Any

from training.demo import generate_groups, linear_schedule
from training.environments import get_environment
from webapp.behaviours import likeness, services
from webapp.behaviours.models import Behaviour
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import get_or_create_run
from webapp.runs.models import Run

BEHAVIOUR_NAME = "draws an extra shape (demo)"
TWIN_NAME = "diagram · scripted twin, extras stop halfway (demo)"
FALLBACK_QUERY = {"q": "extra"}  # the coverage reason names extra nodes and edges


def _labelled(run: Run) -> list[int]:
    return list(
        Rollout.objects.filter(run=run, annotations__label__slug="reward-hacking")
        .distinct()
        .values_list("id", flat=True)
    )


def _query(run: Run, ids: list[int]) -> dict[str, str]:
    """The first proposal that recalls at least 80% of the labelled hacks and is not refused."""
    for p in likeness.propose(run, ids)["proposals"]:
        if p["recall"] >= 0.8 * len(ids) and not p["warning"]:
            return p["query"]
    return FALLBACK_QUERY


def _twin(run: Run, user: Any) -> Run:
    cfg = run.config or {}
    steps, per_step, G = cfg.get("steps", 30), cfg.get("groups_per_step", 12), cfg.get("G", 8)
    half = max(1, steps // 2)
    twin, created = get_or_create_run(
        name=TWIN_NAME,
        kind=Run.Kind.IMPORT,
        environment=run.environment,
        owner=user,
        parent=run,
        status=Run.Status.RUNNING,
        config={
            "policy": "ScriptedDiagramPolicy",
            "scripted": f"extra_node and duplicate faults stop from step {half}: what a policy "
            "trained on the fixed reward should do. Scripted, not trained.",
            "steps": steps,
            "groups_per_step": per_step,
            "G": G,
        },
    )
    if not created:
        return twin
    env = get_environment("diagram")
    skill = linear_schedule(0.2, 0.9, steps)
    first = generate_groups(
        env,
        env.scripted_policy(seed=1, skill=0.5),
        half,
        per_step,
        G=G,
        seed=1,
        skill_schedule=skill,
    )
    fixed = env.scripted_policy(seed=2, skill=0.5, faults={"extra_node": 0.0, "duplicate": 0.0})
    later = generate_groups(
        env, fixed, steps - half, per_step, G=G, seed=2, skill_schedule=lambda s: skill(s + half)
    )
    for g in later:
        g["step"] += half
    groups = first + later
    for i in range(0, len(groups), 50):
        ingest_groups(twin, {"groups": groups[i : i + 50]})
    twin.mark_succeeded()
    return twin


def seed(run: Run, user: Any) -> Behaviour | None:
    """The demo behaviour (from the labelled hacks) and the twin, computed on both runs."""
    b = Behaviour.objects.filter(environment_id=run.environment_id, name=BEHAVIOUR_NAME).first()
    if b is None:
        ids = _labelled(run)
        if not ids:
            return None
        b = services.define(
            run.environment,
            name=BEHAVIOUR_NAME,
            query=_query(run, ids),
            description="Found from the annotator's labelled reward hacks (find more like this).",
            user=user,
        )
    twin = _twin(run, user)
    for r in (run, twin):
        services.update(b, r)
    return b
