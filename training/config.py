"""The config base every job kind shares, and the one CLI every job module uses.

Each job is one dataclass (fields with `help` metadata, validation in `__post_init__` raising
ValueError that names the field) and one `main(config, sink=None, progress=None) -> dict`. `python
-m training.<kind> --config FILE.json` and the Celery worker call the same `main`. The resolved
config is written as config.json beside every output so a run can be reproduced.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

C = TypeVar("C", bound="JobConfig")


def help_field(default: Any = dataclasses.MISSING, help: str = "", **kwargs: Any) -> Any:
    """A dataclass field with TRL-style `help` metadata (mutable defaults via default_factory)."""
    if isinstance(default, (list, dict)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata={"help": help}, **kwargs)
    return field(default=default, metadata={"help": help}, **kwargs)


@dataclass
class JobConfig:
    base_model: str = help_field(
        "", "model folder or hub id to start from (an adapter folder is merged)"
    )
    output_dir: str = help_field("", "where checkpoints, datasets and config.json are written")
    env: str = help_field("diagram", "environment name (training.environments registry)")
    seed: int = help_field(0, "seed for sampling, data order and LoRA init")
    device: str = help_field("auto", "'auto' (CUDA when present, else CPU), 'cpu' or 'cuda[:N]'")

    requires_model = True  # class attribute, not a field: the teacher job may run without a model

    def __post_init__(self) -> None:
        if self.requires_model and not self.base_model:
            raise ValueError("base_model: required (a model folder or hub id)")
        if not self.output_dir:
            raise ValueError("output_dir: required")

    # ---- (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown config field for {cls.__name__}")
        return cls(**data)

    @classmethod
    def from_json(cls: type[C], path: str | os.PathLike) -> C:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def save(
        self, directory: str | os.PathLike, kind: str | None = None, filename: str = "config.json"
    ) -> Path:
        """Write the resolved config as `directory/<filename>`. Never over an HF model's own
        config.json (it would break loading): then `job_config.json`. Returns the path written."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        payload = {"kind": kind, **self.to_dict()} if kind else self.to_dict()
        path = d / filename
        if path.exists() and _is_hf_config(path):
            path = d / "job_config.json"
        path.write_text(json.dumps(payload, indent=2, default=str))
        return path

    @classmethod
    def field_help(cls) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def _is_hf_config(path: Path) -> bool:
    try:
        return "model_type" in json.loads(path.read_text())
    except (OSError, ValueError):
        return False


@dataclass
class TrainJobConfig(JobConfig):
    """Fields every trainer job (sft, grpo, dpo) shares."""

    max_steps: int = help_field(100, "optimizer steps to run")
    learning_rate: float | None = help_field(
        None, "AdamW learning rate; None picks the kind's default"
    )
    use_lora: bool = help_field(True, "train a LoRA adapter instead of all weights")
    lora_rank: int = help_field(16, "LoRA rank r")
    lora_alpha: int | None = help_field(None, "LoRA alpha; None means 2 * rank")
    lora_dropout: float = help_field(0.0, "dropout on the LoRA branch")
    per_device_batch_size: int = help_field(
        8, "examples (GRPO: completions) per device per micro-step"
    )
    gradient_accumulation_steps: int = help_field(1, "micro-steps per optimizer step")
    logging_steps: int = help_field(1, "log metrics every N optimizer steps")
    save_steps: int = help_field(0, "checkpoint every N steps; 0 saves only the final model")
    gradient_checkpointing: bool = help_field(
        False, "recompute activations to save memory (slower)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_steps < 1:
            raise ValueError("max_steps: must be >= 1")
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise ValueError("learning_rate: must be > 0")
        if self.lora_rank < 1:
            raise ValueError("lora_rank: must be >= 1")
        if self.lora_alpha is not None and self.lora_alpha < 1:
            raise ValueError("lora_alpha: must be >= 1")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError("lora_dropout: must be in [0, 1)")
        if self.per_device_batch_size < 1:
            raise ValueError("per_device_batch_size: must be >= 1")
        if self.gradient_accumulation_steps < 1:
            raise ValueError("gradient_accumulation_steps: must be >= 1")
        if self.logging_steps < 1:
            raise ValueError("logging_steps: must be >= 1")
        if self.save_steps < 0:
            raise ValueError("save_steps: must be >= 0")

    @property
    def resolved_lora_alpha(self) -> int:
        return self.lora_alpha if self.lora_alpha is not None else 2 * self.lora_rank

    def trainer_kwargs(self, device: str, default_lr: float) -> dict[str, Any]:
        """TrainingArguments fields shared by SFTConfig / GRPOConfig / DPOConfig."""
        from .common import trainer_device_kwargs

        return dict(
            output_dir=self.output_dir,
            seed=self.seed,
            max_steps=self.max_steps,
            learning_rate=self.learning_rate if self.learning_rate is not None else default_lr,
            per_device_train_batch_size=self.per_device_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            logging_steps=self.logging_steps,
            save_strategy="steps" if self.save_steps else "no",
            save_steps=self.save_steps or 500,
            # Transformers 5.24 name; TRL defaults it on
            activation_checkpointing=self.gradient_checkpointing,
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            **trainer_device_kwargs(device),
        )


def cli(
    config_cls: type[C], main: Callable[..., dict[str, Any]], argv: list[str] | None = None
) -> dict[str, Any]:
    """`python -m training.<kind> --config FILE.json [--output-dir DIR]`: prints the
    summary as JSON."""
    parser = argparse.ArgumentParser(description=(config_cls.__doc__ or "").strip())
    parser.add_argument("--config", required=True, help="JSON file with the config fields")
    parser.add_argument(
        "--jsonl-sink", default=None, help="also write groups/metrics/logs to this JSONL file"
    )
    parser.add_argument(
        "--print-fields", action="store_true", help="print every field's help and exit"
    )
    args = parser.parse_args(argv)
    if args.print_fields:
        for name, text in config_cls.field_help().items():
            print(f"{name:32s} {text}")
        return {}
    config = config_cls.from_json(args.config)
    sink = None
    if args.jsonl_sink:
        from .sinks import JsonlSink

        sink = JsonlSink(args.jsonl_sink)
    try:
        summary = main(
            config, sink=sink, progress=lambda s, t: print(f"progress {s}/{t}", flush=True)
        )
    finally:
        if sink is not None:
            sink.close()
    print(json.dumps(summary, indent=2, default=str))
    return summary


def require_at_least(config: Any, minimum: float, *names: str) -> None:
    """Raise "<field>: must be >= minimum" for the first named field below `minimum`."""
    for name in names:
        if getattr(config, name) < minimum:
            raise ValueError(f"{name}: must be >= {minimum}")


def require_choice(config: Any, name: str, choices: tuple[str, ...]) -> None:
    if getattr(config, name) not in choices:
        raise ValueError(f"{name}: must be " + " or ".join(repr(c) for c in choices))
