"""Group statistics and GRPO advantages, numpy-vectorised over a whole run.

The single home of the math that the recorder, the ingestion path, the diagnostics and the
ablation pages share. The advantage formulas reproduce TRL 1.16's `GRPOTrainer` exactly
(sum-then-normalise by default, normalise-then-sum (GDPO), `scale_rewards`, all-NaN completions
unscorable). Groups are integer ids, so sizes and row order are free; everything reduces with
`np.bincount`. The formulas spelled out: docs/architecture.md, "Module notes".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

EPS = 1e-4  # TRL's constant in the advantage denominator
ScaleRewards = Literal["group", "batch", "none"]
Aggregation = Literal["sum_then_normalize", "normalize_then_sum"]
SCALES = ("group", "batch", "none")  # scale_rewards: TRL's advantage scalings
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")  # multi_objective_aggregation
ZERO_STD_ATOL = 1e-8  # torch.isclose(std, 0) uses atol=1e-8, rtol irrelevant at 0


@dataclass(frozen=True)
class GroupStats:
    """Per-group reductions of one column of values (NaN-aware). Arrays have one entry per group."""

    count: np.ndarray  # number of non-NaN values
    mean: np.ndarray  # NaN where count == 0
    std: np.ndarray  # Bessel-corrected; NaN where count < 2 (as torch/TRL nanstd)
    min: np.ndarray
    max: np.ndarray

    @property
    def zero_std(self) -> np.ndarray:
        """True where the group carries no signal in this column: std 0, or fewer than 2 values."""
        return ~(np.nan_to_num(self.std, nan=0.0) > ZERO_STD_ATOL)


@dataclass(frozen=True)
class AdvantageResult:
    rewards: np.ndarray  # (N,) aggregate reward as TRL defines it; NaN for unscorable completions
    advantages: np.ndarray  # (N,) never NaN
    group_mean: np.ndarray  # (M,) nan-mean of `rewards` per group
    group_std: np.ndarray  # (M,) nan-std (Bessel) of `rewards` per group
    std_used: np.ndarray  # (N,) the std each advantage was divided by (before eps)
    is_std_zero: np.ndarray  # (N,) TRL's frac_reward_zero_std numerator, per completion


def _as_group_ids(group_ids: np.ndarray | None, n: int, group_size: int | None) -> np.ndarray:
    if group_ids is not None:
        ids = np.asarray(group_ids)
        if ids.shape != (n,):
            raise ValueError(f"group_ids: expected shape ({n},), got {ids.shape}")
        # Re-label to 0..M-1 so arbitrary ids (database primary keys) work with bincount.
        _, ids = np.unique(ids, return_inverse=True)
        return ids.astype(np.int64)
    if group_size is None or group_size < 1 or n % group_size:
        raise ValueError(
            f"group_size: {group_size} does not divide {n} rows; pass group_ids instead"
        )
    return np.repeat(np.arange(n // group_size), group_size)


def group_stats(
    values: np.ndarray, group_ids: np.ndarray, n_groups: int | None = None
) -> GroupStats:
    """NaN-aware count/mean/std/min/max of `values` (N,) or (N, K) per group id.

    >>> s = group_stats(np.array([1.0, 3.0, 2.0, 2.0]), np.array([0, 0, 1, 1]))
    >>> s.mean.tolist(), [round(x, 4) for x in s.std.tolist()], s.zero_std.tolist()
    ([2.0, 2.0], [1.4142, 0.0], [False, True])
    """
    v = np.asarray(values, dtype=np.float64)
    two_d = v.ndim == 2
    if not two_d:
        v = v[:, None]
    ids = np.asarray(group_ids, dtype=np.int64)
    m = int(ids.max()) + 1 if n_groups is None and ids.size else (n_groups or 0)
    k = v.shape[1]
    finite = ~np.isnan(v)
    vz = np.where(finite, v, 0.0)
    # Offsets make one bincount reduce all K columns at once: column j of group g lands at g*K + j.
    flat_ids = (ids[:, None] * k + np.arange(k)[None, :]).ravel()
    size = m * k
    count = np.bincount(
        flat_ids, weights=finite.ravel().astype(np.float64), minlength=size
    ).reshape(m, k)
    total = np.bincount(flat_ids, weights=vz.ravel(), minlength=size).reshape(m, k)
    # over: a hostile 1e308 squares to inf; the std is then inf, which is the honest answer.
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mean = total / count
        dev = np.where(finite, v - mean[ids], 0.0)
        ss = np.bincount(flat_ids, weights=(dev * dev).ravel(), minlength=size).reshape(m, k)
        std = np.sqrt(ss / (count - 1))
    std = np.where(count > 1, std, np.nan)
    mn = np.full(size, np.inf)
    mx = np.full(size, -np.inf)
    np.minimum.at(mn, flat_ids, np.where(finite, v, np.inf).ravel())
    np.maximum.at(mx, flat_ids, np.where(finite, v, -np.inf).ravel())
    mn = np.where(count > 0, mn.reshape(m, k), np.nan)
    mx = np.where(count > 0, mx.reshape(m, k), np.nan)
    if not two_d:
        count, mean, std, mn, mx = (a[:, 0] for a in (count, mean, std, mn, mx))
    return GroupStats(count=count, mean=mean, std=std, min=mn, max=mx)


def _nanstd_all(x: np.ndarray) -> float:
    """torch-style nanstd over the whole array (Bessel; NaN if fewer than 2 values)."""
    f = x[~np.isnan(x)]
    return float(np.std(f, ddof=1)) if f.size > 1 else float("nan")


def _batch_std(rewards: np.ndarray, batch_ids: np.ndarray | None) -> np.ndarray:
    """Per-row std of the row's batch (a training step); one batch when batch_ids is None."""
    if batch_ids is None:
        return np.full(rewards.shape, _nanstd_all(rewards) if rewards.size > 1 else 0.0)
    _, b = np.unique(np.asarray(batch_ids), return_inverse=True)
    st = group_stats(rewards, b)
    # TRL uses 0 when the batch holds a single element; nanstd of 1 value is NaN otherwise.
    sizes = np.bincount(b)
    per = np.where(sizes > 1, st.std, 0.0)
    return per[b]


def _batch_mean(rewards: np.ndarray, batch_ids: np.ndarray | None) -> np.ndarray:
    if batch_ids is None:
        return np.full(rewards.shape, np.nanmean(rewards) if np.isfinite(rewards).any() else np.nan)
    _, b = np.unique(np.asarray(batch_ids), return_inverse=True)
    return group_stats(rewards, b).mean[b]


def _nansum_rows(a: np.ndarray) -> np.ndarray:
    """np.nansum(a, axis=1); without NaN a plain sum (the same additions, no copy of the array
    with NaN replaced: a fifth of the advantage math at 10M rollouts)."""
    return np.nansum(a, axis=1) if np.isnan(a).any() else a.sum(axis=1)


def compute_advantages(
    rewards_per_func: np.ndarray,
    weights: np.ndarray | list[float],
    group_ids: np.ndarray | None = None,
    *,
    group_size: int | None = None,
    scale_rewards: ScaleRewards = "group",
    aggregation: Aggregation = "sum_then_normalize",
    batch_ids: np.ndarray | None = None,
    eps: float = EPS,
) -> AdvantageResult:
    """GRPO advantages for N completions with K reward components, exactly as TRL computes them.

    `rewards_per_func` is (N, K) with NaN where a component did not score a completion (TRL's None).
    `group_ids` (N,) says which prompt-group each row belongs to (or pass `group_size` for TRL's
    layout of consecutive groups). `batch_ids` (N,) delimits what "batch" means for
    scale_rewards="batch" and for normalize_then_sum: TRL normalises over one generation batch,
    which for stored rollouts is one training step. None means all rows form one batch. `eps` is the
    constant added to the std (TRL 1e-4; verl 1e-6).

    >>> r = compute_advantages(np.array([[1.0], [0.0], [1.0], [1.0]]), [1.0], group_size=2)
    >>> [round(a, 4) for a in r.advantages.tolist()], r.is_std_zero.tolist()
    ([0.707, -0.707, 0.0, 0.0], [False, False, True, True])
    """
    rpf = np.asarray(rewards_per_func, dtype=np.float64)
    if rpf.ndim == 1:
        rpf = rpf[:, None]
    n, k = rpf.shape
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (k,):
        raise ValueError(f"weights: expected {k} values, got {w.shape}")
    if scale_rewards not in SCALES:
        raise ValueError(f"scale_rewards: must be group, batch or none, got {scale_rewards!r}")
    ids = _as_group_ids(group_ids, n, group_size)
    m = int(ids.max()) + 1 if n else 0
    unscorable = np.isnan(rpf).all(axis=1) if k else np.ones(n, dtype=bool)
    sizes = np.bincount(ids, minlength=m)

    if aggregation == "sum_then_normalize":
        rewards = _nansum_rows(rpf * w[None, :])
        rewards[unscorable] = np.nan
        gs = group_stats(rewards, ids, m)
        mean_rows = gs.mean[ids]
        if scale_rewards == "batch":
            std_rows = _batch_std(rewards, batch_ids)
        else:
            # A single-completion group has std 0 in TRL (num_generations == 1 branch).
            std_rows = np.where(sizes[ids] > 1, gs.std[ids], 0.0)
        with np.errstate(invalid="ignore"):
            adv = rewards - mean_rows
            if scale_rewards != "none":
                adv = adv / (std_rows + eps)
    elif aggregation == "normalize_then_sum":
        cs = group_stats(rpf, ids, m)
        std_k = np.where(sizes[:, None] > 1, cs.std, 0.0)
        with np.errstate(invalid="ignore"):
            reward_k = (rpf - cs.mean[ids]) / (std_k[ids] + eps)
        rewards = _nansum_rows(reward_k * w[None, :])
        rewards[unscorable] = np.nan
        std_rows = _batch_std(rewards, batch_ids) if n > 1 else np.zeros(n)
        with np.errstate(invalid="ignore"):
            adv = (rewards - _batch_mean(rewards, batch_ids)) / (std_rows + eps)
        gs = group_stats(rewards, ids, m)
    else:
        raise ValueError(
            f"aggregation: must be sum_then_normalize or normalize_then_sum, got {aggregation!r}"
        )

    # torch.isclose(NaN, 0) is False: a group whose std is NaN (all unscorable) is not "zero std" in
    # TRL's logging, although it teaches nothing either; diagnostics track that case separately.
    is_std_zero = np.abs(std_rows) <= ZERO_STD_ATOL
    return AdvantageResult(
        rewards=rewards,
        advantages=np.nan_to_num(adv, nan=0.0),
        group_mean=gs.mean,
        group_std=gs.std,
        std_used=std_rows,
        is_std_zero=is_std_zero,
    )


def zero_std_fraction(values: np.ndarray, group_ids: np.ndarray) -> float | np.ndarray:
    """Fraction of groups with zero within-group std: a float for (N,), one per column for (N, K).

    Groups with no finite values are excluded (they say nothing about this column).
    """
    st = group_stats(values, group_ids)
    has = st.count > 0
    z = st.zero_std & has
    denom = has.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = z.sum(axis=0) / denom
    return float(frac) if np.ndim(frac) == 0 else frac


def rank_within_groups(values: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """Rank (0 = lowest) of each value inside its group, ties broken by row order;
    NaN ranks lowest."""
    v = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=-np.inf)
    ids = np.asarray(group_ids, dtype=np.int64)
    order = np.lexsort((np.arange(v.size), v, ids))
    ranks = np.empty(v.size, dtype=np.int64)
    sorted_ids = ids[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_ids)) + 1]
    pos = np.arange(v.size) - np.repeat(starts, np.diff(np.r_[starts, v.size]))
    ranks[order] = pos
    return ranks


def weighted_reward(rewards: Mapping[str, Any], weights: Mapping[str, float]) -> float | None:
    """TRL's aggregate reward of one completion (its logged "reward"): the nan-sum of weight x value
    over the components that scored (None or NaN did not; a component without a weight counts 0);
    None when none scored. The scalar form of `compute_advantages`' sum_then_normalize rewards."""
    scored = [
        (float(v), weights.get(k, 0.0))
        for k, v in rewards.items()
        if v is not None and not math.isnan(float(v))
    ]
    return float(sum(v * w for v, w in scored)) if scored else None
