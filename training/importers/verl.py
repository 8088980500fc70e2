"""verl rollout dumps: the `<step>.jsonl` files verl's trainer writes under
`trainer.rollout_data_dir`, one line per sample (`input`, `output`, `gts`, `score`, `step` and
the reward function's extra keys).

A group is the rows of one `uid` (when the reward function returns it) or one `input` at a step;
rows that cannot be told apart are counted, not imported. `score` is the aggregate; numeric
extra keys become components, weighted by importers/weights.py; advantages are verl's GRPO
formula. No token arrays: the dump carries none, and the import says so in
its gaps (NO_TOKENS). What is exact and what is flagged: docs/integrations.md, "Module notes".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .base import (
    RecordError,
    RolloutRow,
    fill_advantages,
    group_key,
    int_field,
    number_field,
    split_numbers,
    stable_hash,
)
from .weights import PlannedJsonlReader

KNOWN = ("input", "output", "gts", "score", "step", "uid")
OVERLONG = "overlong_reward"  # DAPO reward manager, overlong_buffer.log=True
VERL_EPS = 1e-6  # compute_grpo_outcome_advantage(epsilon=1e-6)
NO_TOKENS = (
    "tokens: none. verl's dump holds decoded text only (no token ids, rollout_log_probs, "
    "old_log_probs, entropies or response mask), so the run has no token view and no "
    "sampler/trainer mismatch; docs/tokens.md says how a verl run can send them"
)


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def _penalised(obj: dict[str, Any]) -> bool:
    return bool(_number(obj.get(OVERLONG))) and _number(obj.get("score")) is not None


def _acc_plus_penalty(obj: dict[str, Any]) -> bool:
    acc, pen, score = (_number(obj.get(k)) for k in ("acc", OVERLONG, "score"))
    return acc is not None and abs(acc + pen - score) <= 1e-6 * max(1.0, abs(score))


@dataclass
class VerlReader(PlannedJsonlReader):
    total = "score"
    overlong_added: bool = False  # set by survey: verl trained on score + overlong_reward
    no_components = "none: the dump has no numeric reward_extra_info next to the score"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.format = "verl"
        self.grouping = (
            "grouped by uid within step when the rows carry it, else by identical input within "
            "step (verl reorders the batch; rows of a group need not be consecutive)"
        )
        self.advantage = (
            "computed: verl's GRPO advantage of score within the group, (r - mean) / (std + 1e-6)"
            + (" without the std (norm_adv_by_std_in_grpo=False)" if self._no_std else "")
        )

    @property
    def _no_std(self) -> bool:
        return self.scale_rewards == "none"

    def settings(self) -> dict[str, Any] | None:
        return {
            "advantage_epsilon": VERL_EPS,
            "scale_rewards": "group",
            **(super().settings() or {}),
        }

    def notes(self) -> dict[str, Any]:
        return {**super().notes(), "gaps": [NO_TOKENS]}

    def _fill(self, rollouts: list[dict[str, Any]]) -> None:
        self.count_beyond(rollouts)
        if len(rollouts) == 1 and rollouts[0].get("advantage") is None:
            # verl gives a lone sample mean 0 and std 1 (TRL's formula would give it 0)
            r = rollouts[0].get("reward")
            rollouts[0]["advantage"] = (
                0.0 if r is None else r / (1.0 + VERL_EPS) if not self._no_std else r
            )
            return
        fill_advantages(rollouts, eps=VERL_EPS, scale=not self._no_std)

    def survey(self, objs: list[dict[str, Any]]) -> None:
        """verl's DAPO reward manager adds `overlong_reward` to the reward it trains on AFTER the
        reward function returned; a function returning a dict (math_dapo does) puts its own
        "score" in reward_extra_info, which replaces the dumped score: the dump's score is then
        the score BEFORE the penalty. A function returning a number puts it in "acc" and the
        dumped score (token_level_scores) already holds the penalty: score = acc + overlong_reward
        on every row. Any penalised row where that does not hold means the former."""
        self.overlong_added = any(
            _penalised(o) and not _acc_plus_penalty(o) for o in objs if OVERLONG in o
        )
        if self.overlong_added:
            self.advantage += (
                "; the total is score + overlong_reward (verl's DAPO manager added the penalty "
                "after the reward function's dict, whose score the dump holds)"
            )

    def parse_row(self, obj: dict[str, Any]) -> RolloutRow:
        step = int_field(obj, "step")
        prompt = obj.get("input")
        if not isinstance(prompt, str):
            raise RecordError("input: is required (the prompt text)")
        uid = obj.get("uid")
        if uid is not None and (isinstance(uid, (dict, list, bool)) or uid == ""):
            raise RecordError("uid: must be a non-empty string or integer")
        key = group_key("uid-", uid) if uid is not None else f"in-{stable_hash(prompt)}"
        self._known_group = (step, key)
        output = obj.get("output")
        if not isinstance(output, str):
            raise RecordError("output: is required (the response text)")
        if "score" not in obj:
            raise RecordError("score: is required (the aggregate reward)")
        reward = number_field(obj, "score", required=False)
        dumped = reward
        if self.overlong_added and reward is not None:
            # verl trained on score + overlong_reward (DAPO manager, a dict-returning function)
            reward += number_field(obj, OVERLONG, required=False) or 0.0
        extra = {
            k: float(v) if isinstance(v, bool) else v for k, v in obj.items() if k not in KNOWN
        }
        rewards, rest = split_numbers(extra, self.components)
        state: dict[str, Any] = {"gts": obj["gts"]} if obj.get("gts") is not None else {}
        if uid is not None:
            state["uid"] = uid
        if dumped != reward:
            state["score_before_overlong"] = dumped
        if rest:
            state["extra"] = rest
        self.complete(rewards, reward)
        # "reward": null is the trainer's own "not scored": it stays missing at ingestion
        rollout: dict[str, Any] = {"completion": output, "rewards": rewards, "reward": reward}
        if state:
            rollout["state"] = state
        return RolloutRow(step=step, key=key, prompt=prompt, rollout=rollout, exact=uid is not None)
