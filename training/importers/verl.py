"""verl rollout dumps: the `<step>.jsonl` files verl's trainer writes under `trainer.rollout_data_dir`.

verl's `RayPPOTrainer._dump_generations` writes one line per sample:

    {"input": prompt text, "output": response text, "gts": ground truth, "score": aggregate reward,
     "step": global step, <every key of the reward function's reward_extra_info, per sample>}

There is no group id in the dump (verl's `uid` is not written), and the batch has been reordered
(`trainer.balance_batch`) before it is dumped, so the rows of a group are not consecutive: a group
is every row with the same `input` at the same `step`. Numeric extra keys become reward components
(or only those named in `components`); other extra keys and `gts` are kept in the rollout's state.
`score` is the aggregate reward. verl does not dump advantages: they are recomputed as the GRPO
advantage of `score` within the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.importers.base import (
    GroupingJsonlReader,
    RecordError,
    RolloutRow,
    int_field,
    number_field,
    split_numbers,
    stable_hash,
)

KNOWN = ("input", "output", "gts", "score", "step")


@dataclass
class VerlReader(GroupingJsonlReader):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.format = "verl"
        self.grouping = ("grouped by identical input within step (verl dumps no group id and reorders the batch; "
                         "rows of a group need not be consecutive)")
        self.advantage = "computed: GRPO advantage of score within the group, (r - mean) / (std + 1e-4)"

    def parse_row(self, obj: dict[str, Any]) -> RolloutRow:
        step = int_field(obj, "step")
        prompt = obj.get("input")
        if not isinstance(prompt, str):
            raise RecordError("input: is required (the prompt text)")
        key = f"in-{stable_hash(prompt)}"
        self._known_group = (step, key)
        output = obj.get("output")
        if not isinstance(output, str):
            raise RecordError("output: is required (the response text)")
        if "score" not in obj:
            raise RecordError("score: is required (the aggregate reward)")
        reward = number_field(obj, "score", required=False)
        rewards, rest = split_numbers({k: v for k, v in obj.items() if k not in KNOWN}, self.components)
        state: dict[str, Any] = {"gts": obj["gts"]} if obj.get("gts") is not None else {}
        if rest:
            state["extra"] = rest
        rollout: dict[str, Any] = {"completion": output, "rewards": rewards, "reward": reward}
        if state:
            rollout["state"] = state
        return RolloutRow(step=step, key=key, prompt=prompt, rollout=rollout)
