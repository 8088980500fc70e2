"""Supervised fine-tuning on teacher trajectories, loss on the completion only ("SFT
buys you syntax").

    python -m training.sft --config sft.json

Data: a JSONL file (or records in memory) in either form
    {"prompt": str | messages, "completion": str | messages}   -> loss on the completion tokens
    {"messages": [...]}                                         -> loss on the assistant turns
Other columns (keys, scores from the teacher job) are ignored. LoRA on every linear layer by default
(rank 64, LR 10x the full-FT default); `full_finetune` trains all weights (the tiny from-scratch
model needs that). Outputs `output_dir/model` and `output_dir/config.json`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import (
    ProgressFn,
    load_model,
    load_records,
    load_tokenizer,
    lora_config,
    make_reporting_callback,
    resolve_device,
    save_final,
)
from .config import TrainJobConfig, cli, help_field
from .sinks import Sink

SFT_DEFAULT_LR = 2e-5  # TRL's SFTConfig default for full fine-tuning
LORA_LR_FACTOR = 10


@dataclass
class SFTJobConfig(TrainJobConfig):
    """Supervised fine-tuning (TRL SFTTrainer), loss on completions / assistant turns only."""

    data: str | list[dict[str, Any]] = help_field(
        "", "JSONL path (or list of records): prompt/completion or messages"
    )
    lora_rank: int = help_field(64, "LoRA rank r (SFT default 64)")
    full_finetune: bool = help_field(
        False, "train all weights instead of a LoRA adapter (overrides use_lora)"
    )
    max_length: int = help_field(1024, "truncate tokenized examples to this many tokens")
    num_train_epochs: float = help_field(
        1.0, "epochs, only used as an upper bound; max_steps stops first"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.data:
            raise ValueError("data: required (a JSONL path or a list of records)")
        if self.full_finetune:
            self.use_lora = False
        if self.max_length < 8:
            raise ValueError("max_length: must be >= 8")


def to_sft_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep only the columns SFTTrainer reads; all records must share one form."""
    if not records:
        raise ValueError("data: the dataset is empty")
    if all("messages" in r for r in records):
        return [{"messages": r["messages"]} for r in records]
    if all("prompt" in r and "completion" in r for r in records):
        return [{"prompt": r["prompt"], "completion": r["completion"]} for r in records]
    raise ValueError("data: every record needs prompt+completion, or every record needs messages")


def main(
    config: SFTJobConfig, sink: Sink | None = None, progress: ProgressFn | None = None
) -> dict[str, Any]:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    device = resolve_device(config.device)
    out = Path(config.output_dir)
    config.save(out, kind="sft")

    records = to_sft_records(load_records(config.data))
    dataset = Dataset.from_list(records)
    conversational_lm = "messages" in records[0]

    model = load_model(config.base_model, device)
    tokenizer = load_tokenizer(config.base_model, padding_side="right")

    lr = SFT_DEFAULT_LR * (LORA_LR_FACTOR if config.use_lora else 1)
    args = SFTConfig(
        **config.trainer_kwargs(device, default_lr=lr),
        num_train_epochs=config.num_train_epochs,
        max_length=config.max_length,
        # Loss on what the model must produce, never on the prompt: completion tokens for
        # prompt/completion data, assistant turns for messages data (needs {% generation %} markers;
        # TRL patches known templates).
        completion_only_loss=None if conversational_lm else True,
        assistant_only_loss=conversational_lm,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(config.lora_rank, config.resolved_lora_alpha, config.lora_dropout)
        if config.use_lora
        else None,
        callbacks=[make_reporting_callback(sink, progress)],
    )
    result = trainer.train()
    model_dir = out / "model"
    save_final(trainer, tokenizer, model_dir)
    config.save(model_dir, kind="sft", filename="job_config.json")
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {
        "kind": "sft",
        "output_dir": str(out),
        "model_dir": str(model_dir),
        "global_step": result.global_step,
        "train_loss": result.training_loss,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "num_examples": len(records),
    }


if __name__ == "__main__":
    cli(SFTJobConfig, main)
