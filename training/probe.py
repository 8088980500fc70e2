"""Probe a policy before GRPO: will the reward give it a gradient at all?

Samples G completions on N prompts with the current policy (no update) and reports, per component,
the within-group std and the fraction of zero-std groups (only within-group variance makes a GRPO
advantage), plus pass@k of the outcome component (unbiased estimator). If pass@k is near zero, RL
has nothing to reinforce: the summary says "do SFT first".

    python -m training.probe --config probe.json
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import Any

import numpy as np

from .common import (
    ProgressFn,
    chat_prompt,
    get_env,
    load_model,
    load_tokenizer,
    resolve_device,
    sample_completions,
)
from .config import JobConfig, cli, help_field, require_at_least, require_choice
from .eval import score_groups
from .sinks import Sink


@dataclass
class ProbeJobConfig(JobConfig):
    """Sample without updating and measure whether the reward can teach anything."""

    split: str = help_field("train", "prompts to probe: 'train' (default) or 'holdout'")
    num_prompts: int = help_field(16, "N: prompts to probe")
    num_generations: int = help_field(8, "G: completions per prompt (use GRPO's num_generations)")
    max_completion_length: int = help_field(256, "max new tokens per completion")
    temperature: float = help_field(1.0, "sampling temperature (use GRPO's)")
    batch_size: int = help_field(8, "prompts per generate() call")
    outcome_component: str | None = help_field(
        None, "component pass@k is computed on; None: the first 'outcome' one"
    )
    pass_threshold: float = help_field(1.0, "a completion passes when the outcome value is >= this")
    min_pass_at_k: float = help_field(0.05, "below this pass@G the summary recommends SFT first")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_choice(self, "split", ("train", "holdout"))
        require_at_least(self, 1, "num_prompts", "max_completion_length", "batch_size")
        if self.num_generations < 2:
            raise ValueError("num_generations: need >= 2 to measure within-group variance")
        if self.temperature <= 0:
            raise ValueError("temperature: must be > 0")
        if not 0.0 <= self.min_pass_at_k <= 1.0:
            raise ValueError("min_pass_at_k: must be in [0, 1]")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k).

    >>> pass_at_k(8, 0, 4), pass_at_k(8, 8, 1), round(pass_at_k(8, 1, 4), 3)
    (0.0, 1.0, 0.5)
    """
    if k > n:
        raise ValueError(f"k: must be <= n ({n}), got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def component_health(matrix: np.ndarray, group_size: int) -> dict[str, float | None]:
    """For one component column arranged as consecutive groups: mean, mean within-group
    std, zero-std share."""
    groups = matrix.reshape(-1, group_size)
    valid = ~np.isnan(groups)
    counts = valid.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.where(
            counts > 1, np.nanstd(np.where(valid, groups, np.nan), axis=1, ddof=1), np.nan
        )
    zero = ~(np.nan_to_num(std, nan=0.0) > 1e-8)  # as training.stats: std 0 or < 2 values
    return {
        "mean": None if not valid.any() else float(np.nanmean(groups)),
        "within_group_std": None if np.isnan(std).all() else float(np.nanmean(std)),
        "frac_zero_std_groups": float(zero.mean()),
    }


def main(
    config: ProbeJobConfig, sink: Sink | None = None, progress: ProgressFn | None = None
) -> dict[str, Any]:
    from .grpo import resolve_model_dir

    device = resolve_device(config.device)
    config.save(config.output_dir, kind="probe")
    env = get_env(config.env)
    names = [c.name for c in env.components]
    outcome = config.outcome_component or next(
        (c.name for c in env.components if c.kind == "outcome"), names[0]
    )
    if outcome not in names:
        raise ValueError(f"outcome_component: {outcome!r} is not a component of {config.env}")
    prompts = env.prompts(config.split, config.num_prompts, seed=config.seed)
    source = resolve_model_dir(config.base_model)
    model, tokenizer = load_model(source, device), load_tokenizer(source)

    samples = sample_completions(
        model,
        tokenizer,
        [chat_prompt(p.text, p.messages) for p in prompts],
        num_generations=config.num_generations,
        max_new_tokens=config.max_completion_length,
        temperature=config.temperature,
        batch_size=config.batch_size,
        seed=config.seed,
    )
    groups, matrix = score_groups(env, prompts, samples, step=0, split=config.split)
    if progress is not None:
        progress(len(prompts), len(prompts))

    G = config.num_generations
    components = {n: component_health(matrix[:, k], G) for k, n in enumerate(names)}
    outcome_values = np.nan_to_num(matrix[:, names.index(outcome)].reshape(-1, G), nan=-np.inf)
    correct = (outcome_values >= config.pass_threshold).sum(axis=1)
    ks = sorted({1, min(4, G), G})
    pass_k = {f"pass@{k}": float(np.mean([pass_at_k(G, int(c), k) for c in correct])) for k in ks}
    aggregate = np.array(
        [r["reward"] if r["reward"] is not None else np.nan for g in groups for r in g["rollouts"]]
    )
    agg_health = component_health(aggregate, G)

    if pass_k[f"pass@{G}"] < config.min_pass_at_k:
        verdict = (
            f"do SFT first: pass@{G} of {outcome} is {pass_k[f'pass@{G}']:.3f} (< "
            f"{config.min_pass_at_k}), "
            "so GRPO would almost never see a success to reinforce"
        )
    elif agg_health["frac_zero_std_groups"] > 0.5:
        verdict = (
            f"weak signal: {agg_health['frac_zero_std_groups']:.0%} of groups have zero reward std "
            "(no advantage, no gradient); raise temperature or G, or make the reward more graded"
        )
    else:
        verdict = "ready for GRPO: groups disagree and successes occur"

    if sink is not None:
        sink.write_groups(groups)
        values = {
            f"probe/{n}/within_group_std": h["within_group_std"]
            for n, h in components.items()
            if h["within_group_std"] is not None
        }
        values.update(
            {f"probe/{n}/frac_zero_std": h["frac_zero_std_groups"] for n, h in components.items()}
        )
        values.update({f"probe/{k}": v for k, v in pass_k.items()})
        sink.write_metrics(0, values)
        sink.log(verdict)
    return {
        "kind": "probe",
        "output_dir": config.output_dir,
        "num_prompts": len(prompts),
        "num_generations": G,
        "outcome_component": outcome,
        "components": components,
        "reward": agg_health,
        "pass_at_k": pass_k,
        "verdict": verdict,
    }


if __name__ == "__main__":
    cli(ProbeJobConfig, main)
