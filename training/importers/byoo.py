"""Bring-your-own-orchestration episodes: the aggregate-plus-sub-metrics records that managed
multi-turn RL services and home-made agent loops produce, one JSON episode per line
(`episode_id`, optional `group_id` and `step`, `turns`, `aggregate_reward_score`, sub-metrics).

The aggregate is what the trainer optimised; the sub-metrics become components, their weights
recovered where the aggregate is their weighted sum, else the rest is an `unexplained` component
(importers/weights.py). Nova's reward-Lambda records are read too. The record's fields in full:
docs/integrations.md, "Module notes".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import (
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
from .weights import PlannedJsonlReader

KNOWN = (
    "episode_id",
    "group_id",
    "step",
    "prompt",
    "turns",
    "aggregate_reward_score",
    "sub_metrics",
    "id",
    "messages",
    "metrics_list",
)


@dataclass
class ByooReader(PlannedJsonlReader):
    total = "aggregate_reward_score"
    no_components = "none: the episodes carry no numeric sub-metrics beside the aggregate"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.format = "byoo"
        self.grouping = (
            "grouped by group_id within step; episodes without one by identical prompt within step"
        )
        self.advantage = "computed: GRPO advantage of aggregate_reward_score within the group"

    def parse_row(self, obj: dict[str, Any]) -> RolloutRow:
        step = int_field(obj, "step", default=0)
        gid = obj.get("group_id")
        if gid is not None and (isinstance(gid, (dict, list, bool)) or gid == ""):
            raise RecordError("group_id: must be a non-empty string or integer")
        if gid is not None:
            self._known_group = (
                step,
                group_key("g-", gid),
            )  # before the turns: a bad turn drops its group
        field_name = "turns" if "turns" in obj or "messages" not in obj else "messages"
        if field_name not in obj:
            raise RecordError(
                "messages: is required (the sample's messages, or turns); a reward service's "
                "output alone has no transcript: join it with its input samples by id"
            )
        turns = messages(obj.get(field_name), field_name)
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
            raise RecordError(
                "aggregate_reward_score: is required (a number, or null when unscored)"
            )
        reward = number_field(obj, "aggregate_reward_score", required=False)
        subs = obj.get("sub_metrics") or {}
        if not isinstance(subs, dict):
            raise RecordError("sub_metrics: must be an object of name -> number")
        listed, types = _metrics_list(obj.get("metrics_list"))
        rewards, rest = split_numbers({**subs, **listed}, self.components)
        self.complete(rewards, reward)  # the sub-metrics' weights, or the rest as 'unexplained'
        state: dict[str, Any] = {k: v for k, v in obj.items() if k not in KNOWN}
        episode = obj.get("episode_id", obj.get("id"))
        if episode is not None:
            state["episode_id"] = episode
        if types:
            state["metric_types"] = types
        if rest:
            state["sub_metrics_extra"] = rest
        rollout: dict[str, Any] = {"transcript": transcript, "rewards": rewards, "reward": reward}
        if state:
            rollout["state"] = state
        return RolloutRow(step=step, key=key, prompt=prompt, rollout=rollout, exact=gid is not None)


def _metrics_list(raw: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """{name: value} and {name: type} from a reward Lambda's metrics_list."""
    if raw is None:
        return {}, {}
    if not isinstance(raw, list):
        raise RecordError("metrics_list: must be a list of {name, value, type}")
    values, types = {}, {}
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
            raise RecordError(f"metrics_list[{i}].name: must be a non-empty string")
        v = m.get("value")
        values[m["name"]] = float(v) if isinstance(v, bool) else v
        if m.get("type") is not None:
            types[m["name"]] = str(m["type"])
    return values, types
