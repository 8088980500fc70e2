"""Teacher trajectories -> validated SFT dataset.

A teacher answers the environment's prompts; the environment scores every answer; answers that pass
the thresholds become `output_dir/sft.jsonl` (prompt/completion chat records, ready for
training.sft), the rest go to `output_dir/rejected.jsonl` with the reasons. Everything is also
emitted as groups through the sink (rollout state says kept or rejected and why), so rejected traces
can be read in the app.

Teachers:
    "scripted"               the environment's reference solver, optionally noised by
                             `scripted_skill` < 1 (the env's scripted_policy) to exercise rejection
    a model folder / hub id  sampled locally with model.generate
    http(s)://host/v1        an OpenAI-compatible chat completions endpoint (urllib, no SDK);
                             the key is read from the env var named by `api_key_env`

    python -m training.teacher --config teacher.json
"""

from __future__ import annotations

import json
import os
import random
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .common import ProgressFn, Sample, chat_prompt, env_prompts, get_env, write_jsonl
from .config import JobConfig, cli, help_field
from .eval import score_groups
from .records import RolloutRecord
from .sinks import Sink


@dataclass
class TeacherJobConfig(JobConfig):
    """Generate teacher trajectories, validate them with the environment, keep the valid
    ones for SFT."""

    requires_model = False  # base_model is unused: the teacher field says who answers

    teacher: str = help_field(
        "scripted", "'scripted', a model folder / hub id, or an OpenAI-compatible base URL"
    )
    teacher_model: str = help_field("", "model name sent to an endpoint teacher")
    api_key_env: str = help_field(
        "OPENAI_API_KEY", "name of the env var holding the endpoint's API key"
    )
    scripted_skill: float = help_field(
        1.0, "scripted teacher quality in [0, 1]; 1 is the reference solution"
    )
    scripted_faults: dict[str, float] = help_field(
        {},
        "fixed fault probabilities of the scripted diagram teacher, e.g. {'omit_edges': 0.5}: "
        "a teacher habit that SFT copies and RL has to undo",
    )
    split: str = help_field("train", "prompts to answer ('train'; never train on 'holdout')")
    num_prompts: int = help_field(128, "prompts to answer")
    samples_per_prompt: int = help_field(1, "teacher answers per prompt")
    max_completion_length: int = help_field(
        1024, "max tokens per teacher answer (model / endpoint teachers)"
    )
    temperature: float = help_field(0.7, "teacher sampling temperature (model / endpoint teachers)")
    min_reward: float = help_field(
        0.9, "keep an answer when its weighted mean component score is >= this"
    )
    min_scores: dict[str, float] = help_field(
        {}, "per-component minimums, e.g. {'schema_valid': 1.0}"
    )
    request_timeout: float = help_field(120.0, "seconds per endpoint request")
    max_nodes: int = help_field(
        0, "only requests with at most this many nodes (diagram env: small diagrams); 0 = all"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.teacher:
            raise ValueError("teacher: required ('scripted', a model path or an endpoint URL)")
        if not 0.0 <= self.scripted_skill <= 1.0:
            raise ValueError("scripted_skill: must be in [0, 1]")
        if self.scripted_faults:
            self.scripted_faults = self._checked_faults()
        if self.split not in ("train", "holdout"):
            raise ValueError("split: must be 'train' or 'holdout'")
        if self.num_prompts < 1:
            raise ValueError("num_prompts: must be >= 1")
        if self.max_nodes < 0:
            raise ValueError("max_nodes: must be >= 0 (0 keeps every request)")
        if self.samples_per_prompt < 1:
            raise ValueError("samples_per_prompt: must be >= 1")
        if self.max_completion_length < 1:
            raise ValueError("max_completion_length: must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature: must be >= 0")

    def _checked_faults(self) -> dict[str, float]:
        """The faults as the environment's scripted policy reads them; a ValueError names this
        field."""
        from .environments import get_environment

        if self.teacher != "scripted":
            raise ValueError("scripted_faults: only for teacher 'scripted'")
        try:
            policy = get_environment(self.env).scripted_policy(faults=self.scripted_faults)
        except ValueError as e:
            raise ValueError(f"scripted_{e}") from None  # the policy's "faults: ..." is our field
        if policy is None:
            raise ValueError(f"scripted_faults: environment {self.env!r} has no scripted policy")
        return policy.faults


Answerer = Callable[[list[Any]], list[list[Sample]]]  # prompts -> samples per prompt


def scripted_teacher(env, config: TeacherJobConfig) -> Answerer:
    rng = random.Random(config.seed)
    policy = None
    if config.scripted_skill < 1.0 or config.scripted_faults:
        policy = env.scripted_policy(
            seed=config.seed, skill=config.scripted_skill, faults=config.scripted_faults
        )
        if policy is None:
            field = "scripted_skill" if config.scripted_skill < 1.0 else "scripted_faults"
            raise ValueError(f"{field}: environment {env.name!r} has no noisy scripted policy")

    def answer(prompts):
        out = []
        if prompts and policy is None and env.solve(prompts[0]) is None:
            raise ValueError(
                f"teacher: environment {env.name!r} has no scripted solver; use a model or endpoint"
            )
        for p in prompts:
            texts = [
                policy.sample(p, rng) if policy else env.solve(p)
                for _ in range(config.samples_per_prompt)
            ]
            out.append(
                [Sample(t, len(t.split()), False) for t in texts]
            )  # whitespace tokens: no tokenizer here
        return out

    return answer


def model_teacher(config: TeacherJobConfig) -> Answerer:
    from .common import load_model, load_tokenizer, resolve_device, sample_completions
    from .grpo import resolve_model_dir

    device = resolve_device(config.device)
    source = resolve_model_dir(config.teacher)
    model, tokenizer = load_model(source, device), load_tokenizer(source)

    def answer(prompts):
        return sample_completions(
            model,
            tokenizer,
            [chat_prompt(p.text, p.messages) for p in prompts],
            num_generations=config.samples_per_prompt,
            max_new_tokens=config.max_completion_length,
            temperature=max(config.temperature, 1e-3),
            seed=config.seed,
        )

    return answer


def endpoint_teacher(config: TeacherJobConfig) -> Answerer:
    """POST {teacher}/chat/completions, OpenAI wire format, one request per prompt
    with n samples."""
    url = config.teacher.rstrip("/") + "/chat/completions"
    key = os.environ.get(config.api_key_env, "")

    def ask(messages: list[dict[str, Any]]) -> list[Sample]:
        body = {
            "model": config.teacher_model,
            "messages": messages,
            "n": config.samples_per_prompt,
            "temperature": config.temperature,
            "max_tokens": config.max_completion_length,
        }
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=config.request_timeout) as response:
            data = json.loads(response.read())
        usage = data.get("usage") or {}
        samples = []
        for choice in data.get("choices", []):
            text = (choice.get("message") or {}).get("content") or ""
            tokens = usage.get("completion_tokens", 0) // max(1, len(data["choices"])) or len(
                text.split()
            )
            samples.append(Sample(text, tokens, choice.get("finish_reason") == "length"))
        return samples

    def answer(prompts):
        return [ask(chat_prompt(p.text, p.messages)) for p in prompts]

    return answer


def make_teacher(env, config: TeacherJobConfig) -> Answerer:
    if config.teacher == "scripted":
        return scripted_teacher(env, config)
    if config.teacher.startswith(("http://", "https://")):
        return endpoint_teacher(config)
    return model_teacher(config)


def problems(
    rollout: dict[str, Any], weights: dict[str, float], config: TeacherJobConfig
) -> tuple[list[tuple[str, str]], float]:
    """The filter's failed checks as (check, reason) -- check being "<component> unscorable",
    "<component> < <minimum>" or "weighted score < <min_reward>" -- and the weighted mean score."""
    values = {n: r["value"] for n, r in rollout["rewards"].items()}
    out = [
        (f"{n} unscorable", f"{n} unscorable: {rollout['rewards'][n]['reason']}")
        for n, v in values.items()
        if v is None
    ]
    for name, minimum in config.min_scores.items():
        v = values.get(name)
        if v is not None and v < minimum:
            reason = f"{name} {v:.2f} < {minimum}: {rollout['rewards'][name]['reason']}"
            out.append((f"{name} < {minimum:g}", reason))
    scored = {n: v for n, v in values.items() if v is not None}
    total_w = sum(weights[n] for n in scored) or 1.0
    mean = sum(weights[n] * v for n, v in scored.items()) / total_w
    if mean < config.min_reward:
        worst = min(scored, key=lambda n: scored[n]) if scored else None
        detail = (
            f"; worst {worst} {scored[worst]:.2f}: {rollout['rewards'][worst]['reason']}"
            if worst
            else ""
        )
        out.append(
            (
                f"weighted score < {config.min_reward:g}",
                f"weighted score {mean:.2f} < {config.min_reward}{detail}",
            )
        )
    return out, mean


def verdict(
    rollout: dict[str, Any], weights: dict[str, float], config: TeacherJobConfig
) -> tuple[bool, str]:
    """(keep, reason): the weighted mean score must reach min_reward and each
    component its minimum."""
    failed, mean = problems(rollout, weights, config)
    return (not failed, "; ".join(r for _, r in failed) or f"weighted score {mean:.2f}")


def main(
    config: TeacherJobConfig, sink: Sink | None = None, progress: ProgressFn | None = None
) -> dict[str, Any]:
    out = Path(config.output_dir)
    config.save(out, kind="teacher")
    env = get_env(config.env)
    unknown = set(config.min_scores) - {c.name for c in env.components}
    if unknown:
        raise ValueError(f"min_scores: unknown component {sorted(unknown)[0]!r}")
    weights = {c.name: c.weight for c in env.components}
    prompts = env_prompts(env, config.split, config.num_prompts, config.seed, config.max_nodes)
    teacher = make_teacher(env, config)

    kept: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    batch = 8
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        groups, _ = score_groups(env, chunk, teacher(chunk), step=0, split=config.split)
        for prompt, group in zip(chunk, groups, strict=True):
            judged = []
            for rollout in group["rollouts"]:
                failed, mean = problems(rollout, weights, config)
                keep = not failed
                why = "; ".join(r for _, r in failed) or f"weighted score {mean:.2f}"
                state = {"teacher": config.teacher, "kept": keep, "verdict": why}
                judged.append(replace(RolloutRecord.from_json(rollout), state=state).to_json())
                record = {
                    "key": prompt.key,
                    "prompt": group["prompt"],
                    "completion": [{"role": "assistant", "content": rollout["completion"]}],
                    "scores": {n: r["value"] for n, r in rollout["rewards"].items()},
                }
                if keep:
                    kept.append(record)
                else:
                    rejected.append({**record, "reason": why, "checks": [c for c, _ in failed]})
                    if sink is not None:
                        sink.log(f"rejected {prompt.key}#{rollout['index']}: {why}")
            group["rollouts"] = judged
        if sink is not None:
            sink.write_groups(groups)
            sink.progress(start + len(chunk), len(prompts))
        if progress is not None:
            progress(start + len(chunk), len(prompts))

    dataset = out / "sft.jsonl"
    write_jsonl(dataset, kept)
    write_jsonl(out / "rejected.jsonl", rejected)
    total = len(kept) + len(rejected)
    by_check: dict[str, int] = {}
    for r in rejected:
        for name in r["checks"]:
            by_check[name] = by_check.get(name, 0) + 1
    return {
        "kind": "teacher",
        "output_dir": str(out),
        "dataset": str(dataset),
        "kept": len(kept),
        "rejected": len(rejected),
        "keep_rate": len(kept) / total if total else 0.0,
        # Why the rest were dropped: trajectories failing each check (one can fail several),
        # most frequent first; every reason in full is in rejected.jsonl.
        "rejected_by": dict(sorted(by_check.items(), key=lambda kv: (-kv[1], kv[0]))),
        "rejected_file": str(out / "rejected.jsonl"),
    }


if __name__ == "__main__":
    cli(TeacherJobConfig, main)
