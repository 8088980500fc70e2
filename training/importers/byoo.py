"""Bring-your-own-orchestration episodes: the aggregate-plus-sub-metrics records that managed
multi-turn RL services (and home-made agent loops) produce. One episode per line:

    {"episode_id": str,
     "group_id": str?,                      episodes sampled from the same prompt together
     "step": int?,                          default 0
     "prompt": str | [messages]?,           default: the turns before the first assistant turn
     "turns": [{"role", "content", "tool_calls"?, "name"?, ...}],
     "aggregate_reward_score": float | null,  the reward the trainer optimised
     "sub_metrics": {name: float}?}         its breakdown -> reward components

Each episode becomes a transcript rollout whose "reward" is the aggregate (the sub-metrics need not
sum to it). A group is every episode with the same group_id at the same step, or, for episodes
without a group_id, every episode with the same prompt at the same step. Advantages are the GRPO
advantage of the aggregate within the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.importers.base import (
    GroupingJsonlReader,
    RecordError,
    RolloutRow,
    group_key,
    int_field,
    messages,
    number_field,
    prompt_value,
    split_numbers,
    stable_hash,
)

KNOWN = ("episode_id", "group_id", "step", "prompt", "turns", "aggregate_reward_score", "sub_metrics")


@dataclass
class ByooReader(GroupingJsonlReader):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.format = "byoo"
        self.grouping = "grouped by group_id within step; episodes without one by identical prompt within step"
        self.advantage = "computed: GRPO advantage of aggregate_reward_score within the group"

    def parse_row(self, obj: dict[str, Any]) -> RolloutRow:
        step = int_field(obj, "step", default=0)
        gid = obj.get("group_id")
        if gid is not None and (isinstance(gid, (dict, list, bool)) or gid == ""):
            raise RecordError("group_id: must be a non-empty string or integer")
        if gid is not None:
            self._known_group = (step, group_key("g-", gid))  # before the turns: a bad turn drops its group
        turns = messages(obj.get("turns"), "turns")
        if obj.get("prompt") is not None:
            prompt = prompt_value(obj["prompt"], "prompt")
            transcript = turns
        else:
            first = next((i for i, t in enumerate(turns) if t["role"] == "assistant"), len(turns))
            if first == 0:
                raise RecordError("prompt: is required when the turns start with the assistant")
            prompt, transcript = turns[:first], turns[first:] or turns
        key = group_key("g-", gid) if gid is not None else f"p-{stable_hash(prompt)}"
        self._known_group = (step, key)
        if "aggregate_reward_score" not in obj:
            raise RecordError("aggregate_reward_score: is required (a number, or null when unscored)")
        reward = number_field(obj, "aggregate_reward_score", required=False)
        subs = obj.get("sub_metrics") or {}
        if not isinstance(subs, dict):
            raise RecordError("sub_metrics: must be an object of name -> number")
        rewards, rest = split_numbers(subs, self.components)
        state: dict[str, Any] = {k: v for k, v in obj.items() if k not in KNOWN}
        if obj.get("episode_id") is not None:
            state["episode_id"] = obj["episode_id"]
        if rest:
            state["sub_metrics_extra"] = rest
        rollout: dict[str, Any] = {"transcript": transcript, "rewards": rewards, "reward": reward}
        if state:
            rollout["state"] = state
        return RolloutRow(step=step, key=key, prompt=prompt, rollout=rollout)
