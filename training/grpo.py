"""GRPO on an environment's reward components, with every rollout recorded.

    python -m training.grpo --config grpo.json [--jsonl-sink rollouts.jsonl]

The components become TRL reward functions (training/rewards.py) weighted by the environment's
weights; the RolloutRecorder stores each completion's component values, reasons and TRL's own
advantage. Multi-turn environments (ask_to_code: a simulated user) play whole episodes through TRL's
rollout_func (training/multiturn.py); the components then score, and the recorder stores, each
episode's transcript. `init_from` starts from an SFT run (its adapter is merged first), so "SFT buys
syntax, RL optimises". Outputs: `output_dir/model` (final adapter or weights + tokenizer),
`output_dir/config.json` (this resolved config), TRL checkpoints under `output_dir/checkpoint-N`
when save_steps > 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import stats
from .common import (
    ProgressFn,
    chat_prompt,
    env_prompts,
    get_env,
    load_model,
    load_tokenizer,
    lora_config,
    make_reporting_callback,
    resolve_device,
    save_final,
)
from .config import TrainJobConfig, cli, help_field, require_choice
from .sinks import BatchingSink, Sink

GRPO_DEFAULT_LR = 1e-6  # TRL's GRPOConfig default for full fine-tuning
LORA_LR_FACTOR = 10  # LoRA wants ~10x the full-FT learning rate


@dataclass
class GRPOJobConfig(TrainJobConfig):
    """GRPO on an environment's reward components (TRL GRPOTrainer)."""

    init_from: str | None = help_field(
        None, "an SFT run's output dir (or model dir) to start from instead of base_model"
    )
    num_prompts: int = help_field(256, "training prompts drawn from the environment's train split")
    max_nodes: int = help_field(
        0, "only requests with at most this many nodes (diagram env: small diagrams); 0 = all"
    )
    num_generations: int = help_field(8, "G: completions per prompt (the group)")
    per_device_batch_size: int = help_field(
        16, "completions per device per micro-step; a multiple of num_generations"
    )
    max_completion_length: int = help_field(256, "max new tokens per completion (truncated beyond)")
    temperature: float = help_field(1.0, "sampling temperature for the rollouts")
    beta: float = help_field(
        0.0, "KL coefficient against the reference (start) policy; 0 skips the reference"
    )
    epsilon: float = help_field(0.2, "PPO-style clip range of the importance ratio")
    num_iterations: int = help_field(
        1, "optimisation passes per generation batch (mu in the GRPO paper)"
    )
    scale_rewards: str = help_field(
        "group", "advantage scaling: 'group' std, 'batch' std, or 'none'"
    )
    loss_type: str = help_field(
        "dapo", "TRL loss: grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo"
    )
    multi_objective_aggregation: str = help_field(
        "sum_then_normalize",
        "combine components: 'sum_then_normalize' (GRPO) or 'normalize_then_sum' (GDPO)",
    )
    reward_weights: list[float] | None = help_field(
        None, "per-component weights; None uses the environment's"
    )
    reward_versions: dict[str, dict[str, Any]] | None = help_field(
        None,
        "component -> version ({target: 'module:function', params, source_hash, name}) trained "
        "instead of the environment's function (a reward replay's versions, "
        "training/reward_versions.py)",
    )
    mask_truncated_completions: bool = help_field(
        False, "exclude truncated completions from the loss"
    )
    record: bool = help_field(True, "record rollouts and metrics into the sink (RolloutRecorder)")
    record_state: bool = help_field(
        False, "also store the environment state (e.g. rendered SVG) per rollout"
    )
    log_completions: bool = help_field(
        False,
        "also let TRL write its own completions_<step>.parquet (prompt, rewards, advantage) to "
        "output_dir",
    )
    multi_turn: bool | None = help_field(
        None,
        "play episodes turn by turn against the environment's simulated user; None = when the env "
        "has them",
    )
    max_turns: int = help_field(
        4, "multi-turn: agent turns per episode; a question in the last one ends it without code"
    )
    max_turn_tokens: int = help_field(
        64,
        "multi-turn: max new tokens per agent turn; max_completion_length caps the episode, "
        "replies included",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_sampling()
        self._check_objective()
        if self.max_turns < 1:
            raise ValueError("max_turns: must be >= 1")
        if self.max_turn_tokens < 1:
            raise ValueError("max_turn_tokens: must be >= 1")
        if self.reward_versions is not None:
            _check_versions(self.reward_versions)

    def _check_sampling(self) -> None:
        """The prompts and the groups sampled for them."""
        if self.num_prompts < 1:
            raise ValueError("num_prompts: must be >= 1")
        if self.max_nodes < 0:
            raise ValueError("max_nodes: must be >= 0 (0 keeps every request)")
        if self.num_generations < 2:
            raise ValueError("num_generations: GRPO needs at least 2 completions per prompt")
        if self.per_device_batch_size % self.num_generations:
            raise ValueError(
                "per_device_batch_size: must be a multiple of num_generations (whole groups)"
            )
        if self.max_completion_length < 1:
            raise ValueError("max_completion_length: must be >= 1")
        if self.temperature <= 0:
            raise ValueError("temperature: must be > 0")

    def _check_objective(self) -> None:
        """The loss and how rewards become advantages."""
        if self.beta < 0:
            raise ValueError("beta: must be >= 0")
        if self.num_iterations < 1:
            raise ValueError("num_iterations: must be >= 1")
        require_choice(self, "scale_rewards", stats.SCALES)
        if self.loss_type not in (
            "grpo",
            "bnpo",
            "dr_grpo",
            "dapo",
            "cispo",
            "sapo",
            "luspo",
            "vespo",
        ):
            raise ValueError(f"loss_type: unknown loss {self.loss_type!r}")
        require_choice(self, "multi_objective_aggregation", stats.AGGREGATIONS)


VERSION_KEYS = {"target", "params", "source_hash", "name", "environment", "component"}


def _check_versions(versions: Any) -> None:
    """Shape only (a config file is read without importing user code): the hook in `main` resolves
    each target, checks its source hash and that the component exists."""
    if not isinstance(versions, dict):
        raise ValueError("reward_versions: must be a mapping component -> version")
    for comp, v in versions.items():
        where = f"reward_versions.{str(comp)[:100]}"
        if not isinstance(comp, str) or not comp:
            raise ValueError("reward_versions: component names must be non-empty strings")
        if not isinstance(v, dict):
            raise ValueError(f"{where}: must be an object with a target")
        unknown = sorted(set(v) - VERSION_KEYS)
        if unknown:
            raise ValueError(
                f"{where}.{str(unknown[0])[:100]}: unknown key (known: "
                f"{', '.join(sorted(VERSION_KEYS))})"
            )
        target = v.get("target")
        if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
            raise ValueError(f"{where}.target: must be 'module:function'")
        if not isinstance(v.get("params", {}), dict):
            raise ValueError(f"{where}.params: must be an object of keyword arguments")
        if not isinstance(v.get("source_hash", ""), str):
            raise ValueError(f"{where}.source_hash: must be a string")
        if v.get("component", comp) != comp:
            raise ValueError(
                f"{where}.component: names another component ({str(v['component'])[:100]!r})"
            )


def resolve_model_dir(path: str) -> str:
    """A run's output dir holds the model under model/; a model dir or hub id is used as given."""
    candidate = Path(path) / "model"
    if candidate.is_dir() and (
        (candidate / "config.json").exists() or (candidate / "adapter_config.json").exists()
    ):
        return str(candidate)
    return path


def main(
    config: GRPOJobConfig, sink: Sink | None = None, progress: ProgressFn | None = None
) -> dict[str, Any]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from .multiturn import is_multi_turn, make_rollout_func, transcript_reward_funcs
    from .recorder import RolloutRecorder
    from .rewards import environment_reward_funcs

    device = resolve_device(config.device)
    out = Path(config.output_dir)
    config.save(out, kind="grpo")

    # Data: the environment's train prompts as chat prompts, with their key for the reward lookup.
    env = get_env(config.env)
    if (
        config.reward_versions
    ):  # "train with this reward": the replayed functions replace the deployed ones
        from .reward_versions import apply_versions

        env = apply_versions(
            env, [{**v, "component": c} for c, v in config.reward_versions.items()]
        )
    prompts = env_prompts(env, "train", config.num_prompts, config.seed, config.max_nodes)
    dataset = Dataset.from_list(
        [{"prompt": chat_prompt(p.text, p.messages), "key": p.key} for p in prompts]
    )
    multi_turn = is_multi_turn(env) if config.multi_turn is None else config.multi_turn
    rollout_func = None
    if multi_turn:
        if not is_multi_turn(env):
            raise ValueError(
                f"multi_turn: environment {config.env!r} has no episodes (no reset method)"
            )
        if env.multi_turn:
            env.max_turns = config.max_turns
        rollout_func = make_rollout_func(env, prompts, max_turn_tokens=config.max_turn_tokens)
        reward_funcs, weights = transcript_reward_funcs(env, prompts)
    else:
        reward_funcs, weights = environment_reward_funcs(env, prompts)
    if config.reward_weights is not None:
        if len(config.reward_weights) != len(reward_funcs):
            raise ValueError(
                f"reward_weights: expected {len(reward_funcs)} weights (one per component)"
            )
        weights = list(config.reward_weights)

    # Model: init_from (an SFT run, adapter merged) or the base model; a fresh LoRA on
    # top when use_lora.
    source = resolve_model_dir(config.init_from or config.base_model)
    model = load_model(source, device)
    tokenizer = load_tokenizer(source)

    lr = GRPO_DEFAULT_LR * (LORA_LR_FACTOR if config.use_lora else 1)
    args = GRPOConfig(
        **config.trainer_kwargs(device, default_lr=lr),
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        temperature=config.temperature,
        beta=config.beta,
        epsilon=config.epsilon,
        num_iterations=config.num_iterations,
        scale_rewards=config.scale_rewards,
        loss_type=config.loss_type,
        multi_objective_aggregation=config.multi_objective_aggregation,
        reward_weights=weights,
        mask_truncated_completions=config.mask_truncated_completions,
        log_completions=config.log_completions,
    )
    recording = config.record and sink is not None
    # One writer thread for everything this job reports, so records reach the sink in order, from a
    # single thread (a database sink need not be thread-safe), and never on the training loop.
    writer = BatchingSink(sink, close_inner=False) if sink is not None else None
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(config.lora_rank, config.resolved_lora_alpha, config.lora_dropout)
        if config.use_lora
        else None,
        callbacks=[make_reporting_callback(writer, progress, metrics=not recording)],
        rollout_func=rollout_func,
    )
    recorder = None
    if recording:
        by_key = {p.key: p for p in prompts}
        state_fn = None
        if config.record_state:

            def state_fn(key: str, _prompt: Any, completion: Any) -> dict[str, Any]:
                return env.state(by_key[key], completion)

        recorder = RolloutRecorder.attach(trainer, writer, background=False, state_fn=state_fn)

    try:
        result = trainer.train()
    finally:
        if writer is not None:
            writer.close()  # drains the queue; the caller's sink stays open
    model_dir = out / "model"
    save_final(trainer, tokenizer, model_dir)
    # The config beside the weights too: the model dir is what gets shared.
    config.save(model_dir, kind="grpo", filename="job_config.json")
    last = _last_logged(trainer)
    return {
        "kind": "grpo",
        "output_dir": str(out),
        "model_dir": str(model_dir),
        "global_step": result.global_step,
        "train_loss": result.training_loss,
        "reward": last.get("reward"),
        "last_metrics": last,
        "groups_recorded": recorder.groups_written if recorder else 0,
    }


def _last_logged(trainer) -> dict[str, float]:
    for entry in reversed(trainer.state.log_history):
        if "reward" in entry or "loss" in entry:
            return {k: v for k, v in entry.items() if isinstance(v, (int, float))}
    return {}


if __name__ == "__main__":
    cli(GRPOJobConfig, main)
