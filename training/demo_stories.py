"""The demo's failure stories from the multi-turn ask-before-coding environment and its simulated
user: two scripted runs of one policy schedule, as ingestion records. In `broken` the
correctness verifier never runs the code (correctness is always 0), so only the behavioural
reward varies until it saturates, while the code never improves; in `fixed` the verifier runs
the hidden tests in the sandbox and correctness varies inside groups. The stories' details:
docs/using.md, "Module notes".
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from .environments.ask_to_code import (
    STYLES,
    AskToCodeEnv,
    ScriptedAskPolicy,
    rollout_record,
)
from .records import GroupRecord, Score

# The sandbox runs each (task, code) once per process (ask_to_code caches the verdicts); the
# scripted policy writes one of two codes per task, so a few tasks keep seeding to seconds.
STORY_TASKS = 6
BROKEN_REASON = "verifier bug: the harness returned before running the hidden tests (0 of 0 run)"
ASKING_STYLES = (
    "solve",
    "ask_first",
    "loop",
)  # a relevant question in the first turn: asked_before_coding = 1


def style_for(rng: random.Random, step: int, steps: int, saturate_at: int, broken: bool) -> str:
    """The scripted policy's behaviour at `step`: anything at first; from `saturate_at` on it
    always asks first. With a working verifier the share of right code ("solve") grows; without one
    it never does."""
    if step < saturate_at:
        return rng.choice(STYLES)
    if broken:
        return rng.choices(ASKING_STYLES, weights=(0.3, 0.5, 0.2))[0]
    progress = (step - saturate_at) / max(steps - 1 - saturate_at, 1)
    solve = 0.3 + 0.5 * progress
    return rng.choices(ASKING_STYLES, weights=(solve, 0.85 - solve, 0.15))[0]


def story_groups(
    broken: bool,
    steps: int = 30,
    groups_per_step: int = 4,
    G: int = 6,
    saturate_at: int = 5,
    seed: int = 0,
) -> list[dict[str, Any]]:
    env = AskToCodeEnv()
    prompts = env.prompts("train", STORY_TASKS, seed)
    rng = random.Random(seed)
    records = []
    for step in range(steps):
        for g in range(groups_per_step):
            prompt = prompts[(step * groups_per_step + g) % len(prompts)]
            rollouts = []
            for i in range(G):
                policy = ScriptedAskPolicy(
                    style_for(rng, step, steps, saturate_at, broken), seed=rng.randrange(2**31)
                )
                rec = rollout_record(env, prompt, i, policy)
                if broken:
                    broken_score = {"correctness": Score(0.0, BROKEN_REASON)}
                    rec = replace(rec, rewards={**rec.rewards, **broken_score})
                rollouts.append(rec)
            group = GroupRecord(
                step=step, key=prompt.key, prompt=prompt.text, split=prompt.split, rollouts=rollouts
            )
            records.append(group.to_json())
    return records
