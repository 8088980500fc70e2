"""Adapters from an environment's reward components to TRL reward functions.

TRL calls each reward function as `f(prompts=..., completions=..., completion_ids=...,
**dataset_columns, trainer_state=..., log_extra=..., log_metric=...)` and wants one float (or None:
"not applicable") per completion. Our components are `fn(Prompt, completion) -> Score(value,
reason)`, where the Prompt carries the hidden spec the grader needs. The adapter finds the Prompt by
the dataset's "key" column, returns the values (NaN -> None) and hands the reasons to TRL's
`log_extra` as column "reason/<component>", which TRL gathers across processes next to its own logs;
the RolloutRecorder reads them from there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .environments.base import Component, Environment, Prompt, Score

REASON_PREFIX = "reason/"


def score_value(score: Score) -> float | None:
    """Score -> TRL value: NaN (unscorable) becomes None, which TRL excludes from the sum.

    >>> from training.environments.base import Score
    >>> score_value(Score(0.5, "ok")), score_value(Score(float("nan"), "no spec"))
    (0.5, None)
    """
    v = float(score.value)
    return None if math.isnan(v) else v


def component_reward_func(
    component: Component, prompts_by_key: dict[str, Prompt]
) -> Callable[..., list[float | None]]:
    """A TRL reward function for one component. Named after the component, so TRL logs
    `rewards/<component>/mean` and the recorder stores scores under the component's name."""

    def reward(
        prompts: list[Any], completions: list[Any], key: list[str] | None = None, **kwargs: Any
    ) -> list[float | None]:
        if key is None:
            raise KeyError(
                f"reward {component.name}: the dataset needs a 'key' column to find each prompt's "
                "spec"
            )
        values: list[float | None] = []
        reasons: list[str] = []
        for k, completion in zip(key, completions, strict=True):
            prompt = prompts_by_key.get(k)
            if prompt is None:
                raise KeyError(f"reward {component.name}: unknown prompt key {k!r}")
            score = component.fn(prompt, completion)
            values.append(score_value(score))
            reasons.append(score.reason)
        log_extra = kwargs.get("log_extra")
        if log_extra is not None:
            log_extra(REASON_PREFIX + component.name, reasons)
        reward.last_reasons = reasons  # for callers outside a trainer
        return values

    reward.__name__ = component.name
    reward.__qualname__ = component.name
    reward.last_reasons = []
    return reward


def environment_reward_funcs(
    env: Environment, prompts: list[Prompt]
) -> tuple[list[Callable], list[float]]:
    """(reward_funcs, reward_weights) for GRPOTrainer, one function per component in
    the env's order."""
    by_key = {p.key: p for p in prompts}
    funcs = [component_reward_func(c, by_key) for c in env.components]
    return funcs, [float(c.weight) for c in env.components]
