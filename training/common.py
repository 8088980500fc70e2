"""Shared plumbing for the job runners: device choice, model/tokenizer loading, LoRA config,
environments, JSONL datasets, and a callback that reports progress, logs and metrics to a sink."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .environments.base import Environment
    from .sinks import Sink

ProgressFn = Callable[[int, int], None]  # (step, total)


# --------------------------------------------------------------------------------------------------
# Device


def resolve_device(device: str = "auto") -> str:
    """'auto' is CUDA when present, else CPU. Anything else is returned as
    given ('cpu', 'cuda:1')."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def trainer_device_kwargs(device: str) -> dict[str, Any]:
    """TrainingArguments fields for `device`: fp32 on CPU (TRL defaults bf16=True), bf16 where
    CUDA has it."""
    import torch

    if device.startswith("cuda"):
        return {"use_cpu": False, "bf16": bool(torch.cuda.is_bf16_supported())}
    return {"use_cpu": True, "bf16": False}


# --------------------------------------------------------------------------------------------------
# Models


def is_adapter_dir(path: str | os.PathLike) -> bool:
    return Path(path, "adapter_config.json").exists()


def load_tokenizer(path: str, *, padding_side: str = "left"):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, padding_side=padding_side)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: str, device: str = "cpu", *, dtype: str = "auto"):
    """A causal LM from a folder or hub id. A LoRA adapter folder (an SFT run's output) is loaded on
    its base model and merged, so the next stage starts from plain weights."""
    from transformers import AutoModelForCausalLM

    torch_dtype = _dtype(dtype, device)
    if is_adapter_dir(path):
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
        model = model.merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    return model.to(device)


def _dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        if device.startswith("cuda") and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, dtype)


def lora_config(
    rank: int, alpha: int, dropout: float = 0.0, target_modules: str | list[str] = "all-linear"
):
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        task_type="CAUSAL_LM",
    )


def save_final(trainer, tokenizer, output_dir: str | os.PathLike) -> None:
    """Save the trained weights (or adapter) and the tokenizer at the top of `output_dir`."""
    trainer.save_model(str(output_dir))
    tokenizer.save_pretrained(str(output_dir))


# --------------------------------------------------------------------------------------------------
# Environments


def get_env(name: str) -> Environment:
    """A fresh instance of the registered environment `name` (KeyError naming the known ones)."""
    from .environments import get_environment

    return get_environment(name)


def env_prompts(
    env: Environment, split: str, n: int, seed: int = 0, max_nodes: int = 0
) -> list[Any]:
    """`env.prompts(split, n, seed)`, keeping only small requests when `max_nodes` > 0
    (an environment that declares the `max_nodes` prompt option, e.g. diagram); 0
    means every request."""
    if not max_nodes:
        return env.prompts(split, n, seed=seed)
    if "max_nodes" not in env.prompt_options:
        raise ValueError(
            f"max_nodes: environment {env.name!r} cannot filter prompts by size; leave it 0"
        )
    return env.prompts(split, n, seed=seed, max_nodes=max_nodes)


def chat_prompt(text: str, messages: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return list(messages) if messages else [{"role": "user", "content": text}]


# --------------------------------------------------------------------------------------------------
# JSONL


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> int:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    return n


def load_records(data: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A dataset given either as a JSONL path or as records already in memory."""
    return read_jsonl(data) if isinstance(data, (str, os.PathLike)) else list(data)


# --------------------------------------------------------------------------------------------------
# Reporting


def make_reporting_callback(
    sink: Sink | None, progress: ProgressFn | None, *, metrics: bool = True
):
    """A TrainerCallback that forwards progress and (optionally) TRL's logged metrics to the sink.

    Metrics are forwarded verbatim (TRL's own keys); None/NaN/non-numeric values are dropped
    because the ingestion schema holds floats. GRPO runs pass metrics=False: the
    RolloutRecorder forwards them."""
    from transformers import TrainerCallback

    class ReportingCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                if progress is not None:
                    progress(state.global_step, state.max_steps)
                if sink is not None:
                    sink.progress(state.global_step, state.max_steps)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or sink is None or not logs:
                return
            if metrics:
                values = numeric_metrics(logs)
                if values:
                    sink.write_metrics(state.global_step, values)
            shown = ", ".join(f"{k}={v:.4g}" for k, v in numeric_metrics(logs).items())
            sink.log(f"step {state.global_step}: {shown}")

    return ReportingCallback()


def numeric_metrics(logs: dict[str, Any]) -> dict[str, float]:
    import math

    out: dict[str, float] = {}
    for k, v in logs.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


# --------------------------------------------------------------------------------------------------
# Sampling (eval, probe, local teacher): plain model.generate, no trainer


class Sample:
    """One sampled completion: text, token count (up to and including eos) and whether it
    hit the limit."""

    __slots__ = ("text", "length", "truncated")

    def __init__(self, text: str, length: int, truncated: bool) -> None:
        self.text, self.length, self.truncated = text, length, truncated

    def __repr__(self) -> str:
        return f"Sample({self.text[:40]!r}, length={self.length}, truncated={self.truncated})"


def sample_completions(
    model,
    tokenizer,
    chats: list[list[dict[str, Any]]],
    *,
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    batch_size: int = 8,
    seed: int = 0,
) -> list[list[Sample]]:
    """`num_generations` sampled completions for each chat prompt, in prompt order (one
    list per prompt)."""
    import torch

    torch.manual_seed(seed)
    tokenizer.padding_side = "left"  # decoder-only generation continues from the right edge
    eos_ids = model.generation_config.eos_token_id
    eos_ids = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids or [])
    eos_ids.add(tokenizer.eos_token_id)
    device = next(model.parameters()).device
    model.eval()
    out: list[list[Sample]] = []
    for start in range(0, len(chats), batch_size):
        texts = [
            tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
            for c in chats[start : start + batch_size]
        ]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            device
        )
        with torch.no_grad():
            generated = model.generate(
                **enc,
                do_sample=True,
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                num_return_sequences=num_generations,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=sorted(eos_ids),
            )
        new_tokens = generated[:, enc["input_ids"].shape[1] :].tolist()
        for i in range(0, len(new_tokens), num_generations):
            group = []
            for ids in new_tokens[i : i + num_generations]:
                end = next((j for j, t in enumerate(ids) if t in eos_ids), None)
                kept = ids if end is None else ids[: end + 1]
                group.append(
                    Sample(tokenizer.decode(kept, skip_special_tokens=True), len(kept), end is None)
                )
            out.append(group)
    return out
