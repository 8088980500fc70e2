"""PRIME-RL rollout records. THE FORMAT IS ASSUMED: PRIME-RL has no documented rollout-dump schema
that this project could check against, so this reader takes the fields its orchestrator keeps per
sample, one JSON object per line:

    {"step": int,                           training step (default 0)
     "problem_id" | "example_id": str|int,  the dataset example; the group id
     "prompt": str | [messages],
     "completion": str | [messages],
     "reward": float | null,                the aggregate reward
     "advantage": float?,                   when the trainer logged it (all rollouts of a group or none)
     "rewards" | "task_rewards": {name: float}?,   per-task / per-criterion breakdown -> components
     "task": str?, ...}                     anything else is kept in the rollout's state

A group is every record with the same example id at the same step (not necessarily consecutive:
PRIME-RL's async orchestrator writes samples as they finish). Without advantages, they are the GRPO
advantage of `reward` within the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.importers.base import (
    GroupingJsonlReader,
    RecordError,
    RolloutRow,
    completion_fields,
    group_key,
    int_field,
    number_field,
    prompt_value,
    split_numbers,
)

KNOWN = ("step", "problem_id", "example_id", "prompt", "completion", "reward", "advantage", "rewards",
         "task_rewards")


@dataclass
class PrimeRLReader(GroupingJsonlReader):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.format = "prime-rl"
        self.grouping = "grouped by problem_id / example_id within step (assumed PRIME-RL record format)"
        self.advantage = "given when every rollout of a group has one; else GRPO advantage of reward in the group"

    def parse_row(self, obj: dict[str, Any]) -> RolloutRow:
        step = int_field(obj, "step", default=0)
        ex = obj.get("problem_id", obj.get("example_id"))
        if ex is None or isinstance(ex, (dict, list, bool)) or ex == "":
            raise RecordError("problem_id: is required (or example_id), a string or integer")
        key = group_key("ex-", ex)
        self._known_group = (step, key)
        prompt = prompt_value(obj.get("prompt"), "prompt")
        if "completion" not in obj:
            raise RecordError("completion: is required")
        rollout: dict[str, Any] = completion_fields(obj["completion"], "completion")
        if "reward" not in obj:
            raise RecordError("reward: is required (the aggregate reward, or null)")
        rollout["reward"] = number_field(obj, "reward", required=False)
        if obj.get("advantage") is not None:
            rollout["advantage"] = number_field(obj, "advantage")
        breakdown = obj.get("rewards", obj.get("task_rewards")) or {}
        if not isinstance(breakdown, dict):
            raise RecordError("rewards: must be an object of name -> number")
        rewards, rest = split_numbers(breakdown, self.components)
        rollout["rewards"] = rewards
        state = {k: v for k, v in obj.items() if k not in KNOWN}
        if rest:
            state["rewards_extra"] = rest
        if state:
            rollout["state"] = state
        return RolloutRow(step=step, key=key, prompt=prompt, rollout=rollout)
