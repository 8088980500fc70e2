"""Token statistics, pure numpy: one rollout's sums (`rollout_sums`), which add up into a step's
(TokenStepStat) and give the rollout's own summaries (RolloutTokens' columns). Computed at ingest
from the values sent (float64, or float32 as sent in binary), before the codec rounds them.

Which tokens count, and the sign conventions: webapp/tokens/models.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from webapp.tokens.codec import TokenArrays
from webapp.tokens.models import LOW_ENTROPY, RATIO_HIGH, RATIO_LOW

MAX_LOG_RATIO = 50.0  # k3 of |d| past this is taken at it: exp(700) would overflow the step's sum
TOOL_ROLES = ("tool", "environment")
LOG_LOW, LOG_HIGH = float(np.log(RATIO_LOW)), float(np.log(RATIO_HIGH))
SYMMETRIC = LOG_LOW == -LOG_HIGH


class TokenSums(NamedTuple):
    """Sufficient statistics; the names are TokenStepStat's columns."""

    n_rollouts: int
    n_tokens: int
    n_pairs: int
    sum_abs_delta: float
    sum_k3: float
    n_ratio_out: int
    max_abs_delta: float | None
    n_entropy: int
    sum_entropy: float
    n_low_entropy: int
    n_mask: int
    n_masked: int
    n_tool_unmasked: int


class RolloutSummary(NamedTuple):
    """RolloutTokens' summary columns."""

    mismatch: float | None
    max_mismatch: float | None
    mean_entropy: float | None
    masked_fraction: float | None
    tool_unmasked: int | None


def counted(t: TokenArrays) -> np.ndarray:
    """The tokens the statistics count: those in the loss when a mask was sent, else all."""
    return t.loss_mask if t.loss_mask is not None else np.ones(len(t), dtype=bool)


def tool_unmasked(t: TokenArrays, roles: list[str]) -> int | None:
    """Tokens of tool or environment messages (by `turn`) that are in the loss; None without a mask
    or turns (then it cannot be known)."""
    if t.loss_mask is None or t.turn is None:
        return None
    tool = np.array([r in TOOL_ROLES for r in roles], dtype=bool)
    return int((tool[t.turn] & t.loss_mask).sum()) if tool.any() else 0


def rollout_sums(t: TokenArrays, roles: list[str]) -> TokenSums:
    """One rollout's sums; `roles` are its transcript's message roles (for tool_unmasked)."""
    keep = t.loss_mask  # None: every token counts (`counted`), without indexing
    n_pairs, sum_abs, sum_k3, n_out, max_abs = 0, 0.0, 0.0, 0, None
    if t.sampler_logprobs is not None and t.trainer_logprobs is not None:
        d = np.subtract(t.trainer_logprobs, t.sampler_logprobs, dtype=np.float64)
        d = d if keep is None else d[keep]
        n_pairs = int(d.size)
        if n_pairs:
            ad = np.abs(d)
            sum_abs, max_abs = float(ad.sum()), float(ad.max())
            dc = np.clip(d, -MAX_LOG_RATIO, MAX_LOG_RATIO) if max_abs > MAX_LOG_RATIO else d
            k3 = np.expm1(dc)
            k3 -= dc
            sum_k3 = float(k3.sum())
            # exp(d) outside [RATIO_LOW, RATIO_HIGH], compared in log space (no second exp); the
            # interval is symmetric there (log 0.5 = -log 2), so one comparison of |d|
            out = ad > LOG_HIGH if SYMMETRIC else (d < LOG_LOW) | (d > LOG_HIGH)
            n_out = int(np.count_nonzero(out))
    n_ent, sum_ent, n_low = 0, 0.0, 0
    if t.entropy is not None:
        e = t.entropy if keep is None else t.entropy[keep]
        n_ent, sum_ent = int(e.size), float(e.sum(dtype=np.float64))
        n_low = int(np.count_nonzero(e < LOW_ENTROPY))
    n_mask = len(t) if t.loss_mask is not None else 0
    n_masked = int(n_mask - np.count_nonzero(t.loss_mask)) if t.loss_mask is not None else 0
    tool = tool_unmasked(t, roles)
    return TokenSums(
        1, len(t), n_pairs, sum_abs, sum_k3, n_out, max_abs, n_ent, sum_ent, n_low, n_mask,
        n_masked, tool or 0,
    )  # fmt: skip


def summary(s: TokenSums, t: TokenArrays, roles: list[str]) -> RolloutSummary:
    return RolloutSummary(
        mismatch=s.sum_abs_delta / s.n_pairs if s.n_pairs else None,
        max_mismatch=s.max_abs_delta,
        mean_entropy=s.sum_entropy / s.n_entropy if s.n_entropy else None,
        masked_fraction=s.n_masked / s.n_mask if s.n_mask else None,
        tool_unmasked=tool_unmasked(t, roles),
    )


def add(sums: Iterable[TokenSums]) -> TokenSums | None:
    """The sum of several rollouts' sums (max for max_abs_delta); None for none."""
    rows = list(sums)
    if not rows:
        return None
    maxes = [r.max_abs_delta for r in rows if r.max_abs_delta is not None]
    total = {f: sum(getattr(r, f) for r in rows) for f in TokenSums._fields if f != "max_abs_delta"}
    return TokenSums(**total, max_abs_delta=max(maxes) if maxes else None)
