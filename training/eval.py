"""Evaluate a checkpoint on the held-out prompts: G sampled completions per prompt, scored by the
environment, emitted as groups (split "holdout") with the advantages GRPO would have given them.

    python -m training.eval --config eval.json --jsonl-sink eval.jsonl
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import stats
from .common import (
    ProgressFn,
    chat_prompt,
    env_prompts,
    get_env,
    load_model,
    load_tokenizer,
    resolve_device,
    sample_completions,
)
from .config import JobConfig, cli, help_field, require_at_least, require_choice
from .records import GroupRecord, RolloutRecord, Score
from .rewards import score_value
from .sinks import Sink

if TYPE_CHECKING:
    from .common import Sample
    from .environments.base import Environment, Prompt


@dataclass
class EvalJobConfig(JobConfig):
    """Sample and score a checkpoint on held-out prompts (no training)."""

    split: str = help_field("holdout", "which prompts to evaluate: 'holdout' (default) or 'train'")
    num_prompts: int = help_field(64, "prompts to evaluate")
    max_nodes: int = help_field(
        0, "only requests with at most this many nodes (diagram env: small diagrams); 0 = all"
    )
    num_generations: int = help_field(4, "G: sampled completions per prompt")
    max_completion_length: int = help_field(256, "max new tokens per completion")
    temperature: float = help_field(1.0, "sampling temperature")
    batch_size: int = help_field(8, "prompts per generate() call (each yields G sequences)")
    step: int = help_field(
        0, "step label for the emitted groups (e.g. the checkpoint's training step)"
    )
    scale_rewards: str = help_field(
        "group", "advantage scaling, as in GRPO: 'group', 'batch' or 'none'"
    )
    multi_objective_aggregation: str = help_field("sum_then_normalize", "as in GRPO")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_choice(self, "split", ("train", "holdout"))
        require_at_least(self, 1, "num_prompts", "max_completion_length", "batch_size")
        if self.max_nodes < 0:
            raise ValueError("max_nodes: must be >= 0 (0 keeps every request)")
        if self.num_generations < 1:
            raise ValueError("num_generations: must be >= 1")
        if self.temperature <= 0:
            raise ValueError("temperature: must be > 0")
        require_choice(self, "scale_rewards", stats.SCALES)
        require_choice(self, "multi_objective_aggregation", stats.AGGREGATIONS)


def score_groups(
    env: Environment,
    prompts: list[Prompt],
    samples: list[list[Sample]],
    *,
    step: int,
    split: str,
    scale_rewards: str = "group",
    aggregation: str = "sum_then_normalize",
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Score every sample, compute advantages with training.stats (TRL's formulas) and
    build ingestion groups. Returns (groups, matrix) where matrix is (N, K) component
    values, NaN where unscorable."""
    names = [c.name for c in env.components]
    weights = [c.weight for c in env.components]
    rows: list[dict[str, Any]] = []  # RolloutRecord fields, less reward and advantage
    values: list[list[float]] = []
    group_ids: list[int] = []
    for gi, (prompt, group) in enumerate(zip(prompts, samples, strict=True)):
        for j, s in enumerate(group):
            scores = env.score(prompt, s.text)
            rewards = {n: Score(score_value(scores[n]), scores[n].reason) for n in names}
            rows.append(
                {
                    "index": j,
                    "completion": s.text,
                    "rewards": rewards,
                    "length": s.length,
                    "truncated": s.truncated,
                    "finish_reason": "length" if s.truncated else "stop",
                }
            )
            values.append([np.nan if rewards[n].value is None else rewards[n].value for n in names])
            group_ids.append(gi)
    matrix = np.array(values, dtype=np.float64).reshape(len(rows), len(names))
    adv = stats.compute_advantages(
        matrix, weights, np.array(group_ids), scale_rewards=scale_rewards, aggregation=aggregation
    )
    built = [
        RolloutRecord(**row, reward=_finite(reward), advantage=_finite(advantage))
        for row, reward, advantage in zip(
            rows, adv.rewards.tolist(), adv.advantages.tolist(), strict=True
        )
    ]
    groups, i = [], 0
    for prompt, group in zip(prompts, samples, strict=True):
        record = GroupRecord(
            step=step,
            key=prompt.key,
            prompt=chat_prompt(prompt.text, prompt.messages),
            split=split,
            rollouts=built[i : i + len(group)],
        )
        groups.append(record.to_json())
        i += len(group)
    return groups, matrix


def _finite(v: float) -> float | None:
    """NaN (unscorable) or inf as null, as the sinks send them."""
    return float(v) if math.isfinite(v) else None


def component_means(names: list[str], matrix: np.ndarray) -> dict[str, float | None]:
    means = {}
    for k, name in enumerate(names):
        col = matrix[:, k]
        means[name] = None if np.isnan(col).all() else float(np.nanmean(col))
    return means


def eval_checks(
    env: Environment, prompts: list[Prompt], groups: list[dict[str, Any]]
) -> dict[str, dict[str, float | int]]:
    """The share of answers with each of the environment's named properties (its
    `eval_checks(prompt, completion) -> {name: bool}`, {} when it has none): name -> {"share",
    "count", "n"}, n counting the answers the check applies to."""
    counts: dict[str, list[int]] = {}
    for prompt, group in zip(prompts, groups, strict=True):
        for rollout in group["rollouts"]:
            for name, yes in env.eval_checks(prompt, rollout["completion"]).items():
                c = counts.setdefault(name, [0, 0])
                c[0], c[1] = c[0] + bool(yes), c[1] + 1
    return {n: {"share": k / t, "count": k, "n": t} for n, (k, t) in counts.items() if t}


def main(
    config: EvalJobConfig, sink: Sink | None = None, progress: ProgressFn | None = None
) -> dict[str, Any]:
    from .grpo import resolve_model_dir

    device = resolve_device(config.device)
    config.save(config.output_dir, kind="eval")
    env = get_env(config.env)
    prompts = env_prompts(env, config.split, config.num_prompts, config.seed, config.max_nodes)
    source = resolve_model_dir(config.base_model)
    model, tokenizer = load_model(source, device), load_tokenizer(source)

    all_groups: list[dict[str, Any]] = []
    matrices: list[np.ndarray] = []
    for start in range(0, len(prompts), config.batch_size):
        batch = prompts[start : start + config.batch_size]
        samples = sample_completions(
            model,
            tokenizer,
            [chat_prompt(p.text, p.messages) for p in batch],
            num_generations=config.num_generations,
            max_new_tokens=config.max_completion_length,
            temperature=config.temperature,
            batch_size=config.batch_size,
            seed=config.seed + start,
        )
        groups, matrix = score_groups(
            env,
            batch,
            samples,
            step=config.step,
            split=config.split,
            scale_rewards=config.scale_rewards,
            aggregation=config.multi_objective_aggregation,
        )
        if sink is not None:
            sink.write_groups(groups)
            sink.progress(start + len(batch), len(prompts))
        if progress is not None:
            progress(start + len(batch), len(prompts))
        all_groups.extend(groups)
        matrices.append(matrix)

    names = [c.name for c in env.components]
    matrix = np.concatenate(matrices)
    rewards = [r["reward"] for g in all_groups for r in g["rollouts"] if r["reward"] is not None]
    values = {
        f"eval/rewards/{n}/mean": v
        for n, v in component_means(names, matrix).items()
        if v is not None
    }
    values["eval/reward"] = float(np.mean(rewards)) if rewards else 0.0
    if sink is not None:
        sink.write_metrics(config.step, values)
        sink.log(
            f"eval on {len(prompts)} {config.split} prompts x {config.num_generations}: "
            f"reward {values['eval/reward']:.4f}"
        )
    checks = eval_checks(env, prompts, all_groups)
    if sink is not None and checks:
        sink.log("; ".join(f"{name}: {c['share']:.1%} of {c['n']}" for name, c in checks.items()))
    return {
        "kind": "eval",
        "output_dir": config.output_dir,
        "checks": checks,
        "num_prompts": len(prompts),
        "num_completions": int(matrix.shape[0]),
        "reward_mean": values["eval/reward"],
        "component_means": component_means(names, matrix),
        "metrics": values,
    }


if __name__ == "__main__":
    cli(EvalJobConfig, main)
