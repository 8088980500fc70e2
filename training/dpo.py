"""Direct preference optimisation on prompt/chosen/rejected pairs (e.g. exported
annotated bad cases).

    python -m training.dpo --config dpo.json

Data: JSONL (or records) with "prompt", "chosen", "rejected": all strings, or all chat messages.
With LoRA the reference model is the base with the adapter disabled; full fine-tuning loads a
second, frozen copy of the start model as the reference (TRL would otherwise rebuild it from the
config's name, which is wrong for a merged SFT adapter).
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

DPO_DEFAULT_LR = 1e-6  # TRL's DPOConfig default for full fine-tuning
LORA_LR_FACTOR = 10


@dataclass
class DPOJobConfig(TrainJobConfig):
    """Direct preference optimisation (TRL DPOTrainer)."""

    data: str | list[dict[str, Any]] = help_field(
        "", "JSONL path (or list of records) with prompt, chosen, rejected"
    )
    beta: float = help_field(
        0.1, "DPO temperature: higher keeps the policy closer to the reference"
    )
    loss_type: str = help_field("sigmoid", "TRL DPO loss: sigmoid, hinge, ipo, ...")
    max_length: int = help_field(1024, "truncate prompt+answer to this many tokens")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.data:
            raise ValueError("data: required (a JSONL path or a list of records)")
        if self.beta <= 0:
            raise ValueError("beta: must be > 0")
        if self.max_length < 8:
            raise ValueError("max_length: must be >= 8")


def to_dpo_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not records:
        raise ValueError("data: the dataset is empty")
    for i, r in enumerate(records):
        missing = {"prompt", "chosen", "rejected"} - set(r)
        if missing:
            raise ValueError(f"data: record {i} lacks {sorted(missing)}")
    return [
        {"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in records
    ]


def main(
    config: DPOJobConfig, sink: Sink | None = None, progress: ProgressFn | None = None
) -> dict[str, Any]:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from .grpo import resolve_model_dir

    device = resolve_device(config.device)
    out = Path(config.output_dir)
    config.save(out, kind="dpo")
    dataset = Dataset.from_list(to_dpo_records(load_records(config.data)))
    source = resolve_model_dir(config.base_model)
    model = load_model(source, device)
    ref_model = None if config.use_lora else load_model(source, device).eval()
    tokenizer = load_tokenizer(source, padding_side="right")

    lr = DPO_DEFAULT_LR * (LORA_LR_FACTOR if config.use_lora else 1)
    args = DPOConfig(
        **config.trainer_kwargs(device, default_lr=lr),
        beta=config.beta,
        loss_type=[config.loss_type],
        max_length=config.max_length,
    )
    trainer = DPOTrainer(
        model=model,
        ref_model=ref_model,
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
    config.save(model_dir, kind="dpo", filename="job_config.json")
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {
        "kind": "dpo",
        "output_dir": str(out),
        "model_dir": str(model_dir),
        "global_step": result.global_step,
        "train_loss": result.training_loss,
        "last_loss": losses[-1] if losses else None,
        "num_pairs": len(dataset),
    }


if __name__ == "__main__":
    cli(DPOJobConfig, main)
