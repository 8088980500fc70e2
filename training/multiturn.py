"""Multi-turn GRPO: episodes driven turn by turn through TRL's `rollout_func`, scored on their
transcripts.

An environment with the episode protocol (`reset(prompt) -> episode`, `episode.step(message) ->
(reply, done)`, `episode.transcript`) plays the simulated user. `run_episodes` samples an agent
turn, lets the episode answer, appends the answer's tokens (masked out of the loss) and samples
again, until the episode ends or the token budget runs out. Details: docs/recording.md, "Module
notes".
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .common import chat_prompt
from .rewards import environment_reward_funcs

if TYPE_CHECKING:
    from .environments.base import Environment, Prompt

# (contexts: token ids per running row, max_new_tokens, rows: those rows' batch positions) ->
# the new tokens per row, cut after the first eos. The default sampler ignores `rows`; a
# scripted one needs them.
GenerateFn = Callable[[list[list[int]], int, list[int]], list[list[int]]]
GenerateFactory = Callable[
    [Any], GenerateFn
]  # trainer -> GenerateFn, built once per generation batch

TRANSCRIPT_FIELD = (
    "transcript"  # rollout_func extra field: the episode's chat messages, prompt included
)
POLICY_TOKENS_FIELD = (
    "policy_tokens"  # rollout_func extra field: tokens the policy generated (env_mask == 1)
)


def is_multi_turn(env: Any) -> bool:
    """Environments with the episode protocol (`reset(prompt)` returning something with `step`)."""
    return env.multi_turn


@dataclass
class EpisodeRollout:
    """One row: the token ids TRL trains on and the transcript the rewards score."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(
        default_factory=list
    )  # 1: sampled from the policy; 0: written by the env
    transcript: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False  # the episode ended on its own (code, out of turns), not on the token budget

    @property
    def policy_tokens(self) -> int:
        return sum(self.env_mask)


# --------------------------------------------------------------------------------------------------
# Token bookkeeping


def _chat_ids(
    tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool
) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
    )


def reply_suffix_ids(tokenizer: Any, message: dict[str, Any]) -> list[int]:
    """The tokens that follow an assistant turn's eos: `message` rendered by the chat template, then
    the next generation prompt. Computed on a dummy conversation, so the policy's tokens are never
    re-tokenized (the same trick as TRL's `_get_tool_suffix_ids`).

    Templates that write something after the eos of an assistant turn (a newline, typically) put it
    at the start of the suffix."""
    dummy = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    prefix = _chat_ids(tokenizer, dummy, add_generation_prompt=False)
    full = _chat_ids(
        tokenizer, [*dummy, {"role": message["role"], "content": message["content"]}], True
    )
    eos_positions = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if eos_positions:
        prefix = prefix[: eos_positions[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError(
            "chat template: the conversation so far is not a token prefix of the next one; "
            "multi-turn rollouts need a prefix-preserving template"
        )
    return full[len(prefix) :]


def _cut_after_eos(ids: list[int], eos_ids: set[int]) -> list[int]:
    end = next((j for j, t in enumerate(ids) if t in eos_ids), None)
    return ids if end is None else ids[: end + 1]


# --------------------------------------------------------------------------------------------------
# Episodes


def run_episodes(
    env: Any,
    prompts: Sequence[Prompt],
    tokenizer: Any,
    generate: GenerateFn,
    *,
    max_turn_tokens: int,
    max_completion_length: int,
    eos_token_ids: Sequence[int] | None = None,
) -> list[EpisodeRollout]:
    """Play one episode per prompt, all rows batched turn by turn. The episode decides when
    it is over (code submitted, out of turns); the budget `max_completion_length` counts
    every completion token, env replies included, as TRL does. `generate` samples a turn for
    each still-running row."""
    eos = set(eos_token_ids or []) | {tokenizer.eos_token_id}
    episodes = [env.reset(p) for p in prompts]
    rows = [
        EpisodeRollout(_chat_ids(tokenizer, ep.transcript, add_generation_prompt=True))
        for ep in episodes
    ]
    active = list(range(len(rows)))
    suffix_cache: dict[str, list[int]] = {}
    # Episode steps run the hidden tests (a sandbox subprocess each, up to its
    # timeout): in parallel.
    workers = max(1, min(len(rows), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode") as pool:
        while active:
            budgets = {i: max_completion_length - len(rows[i].completion_ids) for i in active}
            new_tokens = generate(
                [rows[i].prompt_ids + rows[i].completion_ids for i in active],
                min(max_turn_tokens, max(budgets.values())),
                list(active),
            )
            messages = []
            for i, ids in zip(active, new_tokens, strict=True):
                ids = _cut_after_eos(list(ids), eos)[: min(max_turn_tokens, budgets[i])]
                rows[i].completion_ids += ids
                rows[i].env_mask += [1] * len(ids)
                messages.append(tokenizer.decode(ids, skip_special_tokens=True))
            results = list(
                pool.map(
                    lambda pair: pair[0].step(pair[1]),
                    [(episodes[i], m) for i, m in zip(active, messages, strict=True)],
                )
            )
            still = []
            for i, (_reply, done) in zip(active, results, strict=True):
                row = rows[i]
                if done:
                    row.done = True
                    continue
                message = episodes[i].transcript[-1]  # the reply the episode just appended
                key = json.dumps([message["role"], message["content"]])
                if key not in suffix_cache:
                    suffix_cache[key] = reply_suffix_ids(tokenizer, message)
                closing = (
                    []
                    if row.completion_ids and row.completion_ids[-1] in eos
                    else [tokenizer.eos_token_id]
                )
                suffix = closing + suffix_cache[key]
                if len(row.completion_ids) + len(suffix) >= max_completion_length:
                    continue  # no room for another turn: the episode stops here, unfinished
                row.completion_ids += suffix
                row.env_mask += [0] * len(suffix)
                still.append(i)
            active = still
    for row, ep in zip(rows, episodes, strict=True):
        row.transcript = [dict(m) for m in ep.transcript]
    return rows


# --------------------------------------------------------------------------------------------------
# TRL glue


def trainer_generate(trainer: Any) -> GenerateFn:
    """Sample with the trainer's model and TRL's own sampling settings (temperature, top_p, ...),
    left padded, one call per turn for every running row."""
    if getattr(trainer, "use_vllm", False) or getattr(
        trainer, "use_transformers_continuous_batching", False
    ):
        raise ValueError(
            "multi_turn: rollouts sample with model.generate; vLLM and continuous batching are "
            "not supported by training.multiturn yet"
        )
    import copy

    import torch
    from trl.models import unwrap_model_for_generation

    tokenizer = trainer.processing_class
    eos = set(trainer.eos_token_ids)

    def generate(
        contexts: list[list[int]], max_new_tokens: int, rows: list[int] | None = None
    ) -> list[list[int]]:
        device = trainer.accelerator.device
        width = max(len(c) for c in contexts)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts], device=device)
        attention = torch.tensor(
            [[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=device
        )
        config = copy.deepcopy(trainer.generation_config)
        config.max_new_tokens = max_new_tokens
        kwargs = {**trainer.generation_kwargs, "max_new_tokens": max_new_tokens}
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped, trainer.accelerator, generation_kwargs=kwargs
            ) as model,
            torch.no_grad(),
        ):
            out = model.generate(
                input_ids=input_ids, attention_mask=attention, generation_config=config
            )
        return [_cut_after_eos(row, eos) for row in out[:, width:].tolist()]

    return generate


def _messages_key(messages: Sequence[dict[str, Any]]) -> str:
    # Only role and content: a datasets round trip may add other keys (set to None)
    # to every message.
    return json.dumps([[m.get("role"), m.get("content")] for m in messages])


def make_rollout_func(
    env: Environment,
    prompts: Sequence[Prompt],
    *,
    max_turn_tokens: int,
    generate: GenerateFactory | None = None,
) -> Callable[[list[Any], Any], dict[str, Any]]:
    """A TRL `rollout_func` playing `env`'s episodes on the dataset rows built from `prompts` (each
    row's "prompt" column is `chat_prompt(prompt.text, prompt.messages)`, as in training/grpo.py).
    TRL passes the rows already repeated num_generations times, and wants one completion back per
    row. `generate` replaces the policy's sampler (tests)."""
    by_messages = {_messages_key(chat_prompt(p.text, p.messages)): p for p in prompts}

    def rollout_func(batch_prompts: list[Any], trainer: Any) -> dict[str, Any]:
        try:
            rows = [by_messages[_messages_key(m)] for m in batch_prompts]
        except KeyError:
            raise KeyError(
                "multi_turn: a dataset prompt matches none of the environment's prompts"
            ) from None
        sampler = (generate or trainer_generate)(trainer)
        rollouts = run_episodes(
            env,
            rows,
            trainer.processing_class,
            sampler,
            max_turn_tokens=max_turn_tokens,
            max_completion_length=trainer.max_completion_length,
            eos_token_ids=trainer.eos_token_ids,
        )
        return {
            "prompt_ids": [r.prompt_ids for r in rollouts],
            "completion_ids": [r.completion_ids for r in rollouts],
            "logprobs": None,  # TRL recomputes them (no vLLM importance sampling on this path)
            "env_mask": [r.env_mask for r in rollouts],
            TRANSCRIPT_FIELD: [r.transcript for r in rollouts],
            POLICY_TOKENS_FIELD: [r.policy_tokens for r in rollouts],
        }

    return rollout_func


def transcript_reward_funcs(
    env: Environment, prompts: Sequence[Prompt]
) -> tuple[list[Callable], list[float]]:
    """The environment's components as TRL reward functions that score the episode transcript (the
    rollout_func's `transcript` field) instead of TRL's decoded completion; named, weighted and
    reason-logging exactly like the single-turn ones (training/rewards.py)."""
    funcs, weights = environment_reward_funcs(env, list(prompts))
    return [_on_transcripts(f) for f in funcs], weights


def _on_transcripts(func: Callable[..., list[float | None]]) -> Callable[..., list[float | None]]:
    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        transcripts = kwargs.pop(TRANSCRIPT_FIELD, None)
        if transcripts is None:
            raise KeyError(
                f"reward {func.__name__}: no '{TRANSCRIPT_FIELD}' field; multi-turn rewards need "
                "training.multiturn's rollout_func"
            )
        return func(prompts, transcripts, **kwargs)

    reward.__name__ = reward.__qualname__ = func.__name__
    return reward
