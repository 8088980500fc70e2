"""Token arrays for the demo's scripted rollouts, with a planted sampler/trainer mismatch.

A scripted policy has no model, so the tokens are drawn deterministically the way a real run's
look: word pieces with offsets, tool and user turns masked out, log-probs mostly near 0 with a
tail, entropy sharpening slowly, GRPO's advantage on every token, and a mismatch that grows from
a chosen step so the token diagnostics have something to find. Details: docs/tokens.md, "Module
notes".
"""

from __future__ import annotations

import re
import zlib
from dataclasses import replace
from typing import Any

import numpy as np

from . import stats
from .records import RolloutRecord, Score

PIECE = re.compile(r"\s+|\w+|[^\w\s]")
VOCAB = 32_000
HEALTHY_NOISE = 0.01  # nats: a bf16 sampler against an fp32 trainer
DRIFT_NOISE, DRIFT_GROWTH = 0.12, 0.02  # nats at the drift step, and added each step after


def pieces(text: str) -> list[tuple[int, str]]:
    """(character offset, piece) of each token of `text`."""
    return [(m.start(), m.group()) for m in PIECE.finditer(text)]


def _content(m: Any) -> str:
    c = m.get("content") if isinstance(m, dict) else None
    return c if isinstance(c, str) else ""


def rollout_tokens(
    transcript: list[dict[str, Any]],
    advantage: float,
    step: int,
    steps: int,
    rng: np.random.Generator,
    drift_step: int | None = None,
) -> dict[str, list]:
    """The `tokens` object of one rollout (the ingestion contract, webapp/tokens/models.py)."""
    first = next((i for i, m in enumerate(transcript) if m.get("role") == "assistant"), 0)
    ids, offsets, turns, mask = [], [], [], []
    for t in range(first, len(transcript)):
        trained = transcript[t].get("role") == "assistant"
        for off, piece in pieces(_content(transcript[t])):
            ids.append(zlib.crc32(piece.encode()) % VOCAB)
            offsets.append(off)
            turns.append(t)
            mask.append(1 if trained else 0)
    n = len(ids)
    trainer = -rng.gamma(0.5, 0.7, n)
    if drift_step is not None and step >= drift_step:
        noise = DRIFT_NOISE + DRIFT_GROWTH * (step - drift_step)
    else:
        noise = HEALTHY_NOISE
    sampler = np.minimum(trainer + rng.normal(0.0, noise, n), 0.0)
    # Tool and user tokens were never sampled: a recorder fills the sampler's with the trainer's.
    sampler = np.where(np.array(mask, dtype=bool), sampler, trainer)
    entropy = rng.gamma(2.0, (1.1 - 0.3 * step / max(steps - 1, 1)) / 2.0, n)
    return {
        "ids": ids,
        "offsets": offsets,
        "sampler_logprobs": np.round(sampler, 5).tolist(),
        "trainer_logprobs": np.round(trainer, 5).tolist(),
        "entropy": np.round(entropy, 5).tolist(),
        "advantages": [round(advantage, 6)] * n,
        "loss_mask": mask,
        "turn": turns,
    }


def _value(v: Any) -> float:
    v = v.value if isinstance(v, Score) else v
    return np.nan if v is None else v


def add_tokens(
    records: list[dict[str, Any]],
    weights: dict[str, float],
    drift_step: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """The ingestion records with a `tokens` object on every rollout (in place, and returned)."""
    rng = np.random.default_rng(seed)
    steps = max((r["step"] for r in records), default=0) + 1
    names = list(weights)
    for group in records:
        rollouts = [RolloutRecord.from_json(r) for r in group["rollouts"]]
        values = np.array([[_value(r.rewards[c]) for c in names] for r in rollouts])
        w = [weights[c] for c in names]
        adv = stats.compute_advantages(values, w, group_size=len(values)).advantages
        with_tokens = []
        for r, a in zip(rollouts, adv.tolist(), strict=True):
            transcript = r.transcript or [{"role": "assistant", "content": r.completion or ""}]
            tokens = rollout_tokens(transcript, a, group["step"], steps, rng, drift_step=drift_step)
            with_tokens.append(replace(r, tokens=tokens).to_json())
        group["rollouts"] = with_tokens
    return records
