"""Scripted ask-to-code rollouts as ingestion records (demo data, demo stories, benchmarks)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from ...records import GroupRecord, RolloutRecord
from ...records import Score as RecordScore
from ..base import Prompt, Split
from .environment import AskToCodeEnv
from .parsing import agent_turns
from .policy import GOOD_STYLES, STYLES, AgentPolicy, ScriptedAskPolicy


def run_episode(env: AskToCodeEnv, prompt: Prompt, policy: AgentPolicy) -> list[dict[str, Any]]:
    ep = env.reset(prompt)
    done = False
    while not done:
        _, done = ep.step(policy(prompt, ep.transcript))
    return ep.transcript


def rollout_record(
    env: AskToCodeEnv, prompt: Prompt, index: int, policy: ScriptedAskPolicy
) -> RolloutRecord:
    transcript = run_episode(env, prompt, policy)
    scores = env.score(prompt, transcript)
    return RolloutRecord(
        index=index,
        transcript=transcript,
        rewards={name: RecordScore.of(s) for name, s in scores.items()},
        # whitespace tokens of the agent's turns: no tokenizer in the demo path
        length=sum(len(t.split()) for t in agent_turns(transcript)),
        truncated=False,
        state={**env.state(prompt, transcript), "policy_style": policy.style},
    )


def generate_groups(
    env: AskToCodeEnv | None = None,
    steps: int = 1,
    groups_per_step: int = 4,
    G: int = 6,
    seed: int = 0,
    split: Split = "train",
    styles: Sequence[str] = STYLES,
    skill_schedule: Callable[[int], float] | None = None,
    holdout_groups: int = 0,
) -> list[dict[str, Any]]:
    """Ingestion records: per step, `groups_per_step` groups of G scripted rollouts of one prompt
    (plus `holdout_groups` groups on fixed held-out prompts). Rollout i of a group uses a style
    drawn from `styles`, or, with `skill_schedule(step)` = p, a good style with probability p and
    another otherwise, so rewards can improve over a run. Deterministic in `seed`."""
    env = env or AskToCodeEnv()
    rng = random.Random(seed)
    train = env.prompts(split, steps * groups_per_step, seed)
    holdout = env.prompts("holdout", holdout_groups, seed) if holdout_groups else []
    bad = [s for s in styles if s not in GOOD_STYLES] or list(styles)
    records: list[dict[str, Any]] = []
    for step in range(steps):
        chosen = train[step * groups_per_step : (step + 1) * groups_per_step]
        for prompt in chosen + holdout:
            rollouts = []
            for i in range(G):
                if skill_schedule is not None:
                    pool = GOOD_STYLES if rng.random() < skill_schedule(step) else bad
                    style = rng.choice(list(pool))
                else:
                    style = styles[(i + rng.randrange(len(styles))) % len(styles)]
                policy = ScriptedAskPolicy(style, seed=rng.randrange(2**31))
                rollouts.append(rollout_record(env, prompt, i, policy))
            group = GroupRecord(
                step=step, key=prompt.key, prompt=prompt.text, split=prompt.split, rollouts=rollouts
            )
            records.append(group.to_json())
    return records
