"""Demo data: groups of scripted rollouts, scored, in the ingestion record format.

    python -m training.demo --env diagram --steps 20 --out demo.jsonl

Each record is one group (G rollouts of one prompt at one step). Values are plain floats, or None
where a component could not score (NaN never reaches JSON).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from typing import Any, Protocol

from . import records
from .environments.base import Environment, Prompt
from .records import GroupRecord, RolloutRecord

MAX_TRAIN_POOL = 256  # prompts are revisited across steps, as epochs over a dataset would


class Policy(Protocol):
    skill: float

    def sample(self, prompt: Prompt, rng: random.Random | None = None) -> str: ...


def rollout(env: Environment, prompt: Prompt, index: int, completion: str) -> RolloutRecord:
    return RolloutRecord(
        index=index,
        completion=completion,
        rewards={name: records.Score.of(s) for name, s in env.score(prompt, completion).items()},
        length=len(completion.split()),  # whitespace tokens: no tokenizer in the demo path
        truncated=False,
        state=env.state(prompt, completion),
    )


def rollout_record(env: Environment, prompt: Prompt, index: int, completion: str) -> dict[str, Any]:
    """`rollout` in the ingestion format (the environments' demo generators build on it)."""
    return rollout(env, prompt, index, completion).to_json()


def generate_groups(
    env: Environment,
    policy: Policy,
    steps: int,
    groups_per_step: int,
    G: int = 8,
    seed: int = 0,
    skill_schedule: Callable[[int], float] | None = None,
    holdout_groups: int = 0,
) -> list[dict[str, Any]]:
    """Records for `steps` steps of `groups_per_step` train groups (plus `holdout_groups`
    eval groups on fixed held-out prompts), each with G rollouts. `skill_schedule(step)`
    sets `policy.skill` before each step, so rewards can improve over the run.
    Deterministic in `seed`."""
    rng = random.Random(seed)
    train = env.prompts("train", min(steps * groups_per_step, MAX_TRAIN_POOL), seed)
    holdout = env.prompts("holdout", holdout_groups, seed) if holdout_groups else []
    out: list[dict[str, Any]] = []
    for step in range(steps):
        if skill_schedule is not None:
            policy.skill = skill_schedule(step)
        chosen = [train[(step * groups_per_step + j) % len(train)] for j in range(groups_per_step)]
        for prompt in chosen + holdout:
            rollouts = [rollout(env, prompt, i, policy.sample(prompt, rng)) for i in range(G)]
            group = GroupRecord(
                step=step, key=prompt.key, prompt=prompt.text, split=prompt.split, rollouts=rollouts
            )
            out.append(group.to_json())
    return out


def linear_schedule(start: float, end: float, steps: int) -> Callable[[int], float]:
    """Skill rising (or falling) linearly from `start` at step 0 to `end` at the last step."""
    return lambda step: start + (end - start) * step / max(steps - 1, 1)


def main(argv: list[str] | None = None) -> None:
    from .environments import get_environment

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="diagram")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--holdout-groups", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="demo.jsonl")
    args = parser.parse_args(argv)
    env = get_environment(args.env)
    policy = env.scripted_policy(seed=args.seed, skill=0.2)
    if policy is None:
        raise SystemExit(f"no scripted policy for environment {args.env!r}")
    records = generate_groups(
        env,
        policy,
        args.steps,
        args.groups_per_step,
        args.G,
        args.seed,
        linear_schedule(0.2, 0.9, args.steps),
        holdout_groups=args.holdout_groups,
    )
    with open(args.out, "w") as f:
        f.writelines(json.dumps(record, allow_nan=False) + "\n" for record in records)
    print(f"wrote {len(records)} groups to {args.out}")


if __name__ == "__main__":
    main()
