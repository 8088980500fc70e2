"""Ablation: recompute every group's advantages with components dropped or re-weighted, or another
aggregation, and measure what changes. Pure numpy, no Django.

Both sides go through `training.stats.compute_advantages` (the function ingestion uses, one batch
per step), so the comparison isolates the spec. Everything is vectorised over the whole run; groups
of equal size G (how GRPO samples) take a row-wise fast path on an (M, G) array.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from . import stats
from .diagnostics import (
    ComponentInfo,
    RunArrays,
    _json_float,
    _pct,
    dense_ids,
    regular_blocks,
)

A = TypeVar("A")
B = TypeVar("B")
NO_SIGNAL = "this component produced (almost) no training signal in this run"


@dataclass(frozen=True)
class AblationSpec:
    drop: tuple[str, ...] = ()
    weights: dict[str, float] = field(default_factory=dict)  # re-weights (name -> new weight)
    scale_rewards: str = "group"
    aggregation: str = "sum_then_normalize"

    def as_dict(self) -> dict[str, Any]:
        return {
            "drop": list(self.drop),
            "weights": dict(self.weights),
            "scale_rewards": self.scale_rewards,
            "aggregation": self.aggregation,
        }


@dataclass(frozen=True)
class Baseline:
    """How the run computed its advantages: its weights and aggregation."""

    scale_rewards: str = "group"
    aggregation: str = "sum_then_normalize"
    eps: float = (
        stats.EPS
    )  # the trainer's constant in the advantage denominator (TRL 1e-4, verl 1e-6)


PARALLEL_ROWS = 200_000  # past this many rows the two sides are computed on two threads


def both(f: Callable[[], A], g: Callable[[], B], rows: int) -> tuple[A, B]:
    """f() and g(), on two threads for a large run: numpy releases the GIL in its loops, so the
    run's own side and the spec's take two cores (~1.7x at 10M rollouts on two)."""
    if rows < PARALLEL_ROWS:
        return f(), g()
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(f)
        second = g()
        return first.result(), second


def tie_averaged_ranks(values: np.ndarray, gidx: np.ndarray) -> np.ndarray:
    """Rank of each value inside its group (0 = lowest), ties given their average rank; NaN lowest.

    stats.rank_within_groups breaks ties by row order, which is right for "who is best" but biases a
    Spearman correlation on the binary rewards GRPO sees all the time. One integer argsort of the
    key (group, dense value code) replaces a two-key lexsort, which is ~5x slower at a million rows.
    """
    v = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=-np.inf)
    n = v.size
    if n == 0:
        return np.zeros(0)
    _, code = np.unique(v, return_inverse=True)  # equal values share a code: ties stay ties
    code = code.reshape(-1).astype(np.int64)
    key = np.asarray(gidx, dtype=np.int64) * (int(code.max()) + 1) + code
    order = np.argsort(key, kind="stable")
    sk, sg = key[order], np.asarray(gidx)[order]
    pos = np.arange(n)
    new_group = np.r_[True, sg[1:] != sg[:-1]]
    new_block = np.r_[True, sk[1:] != sk[:-1]]
    group_start = np.maximum.accumulate(np.where(new_group, pos, 0))
    block_start = np.maximum.accumulate(np.where(new_block, pos, 0))
    block_end = np.r_[np.flatnonzero(new_block)[1:], n] - 1  # last position of each block
    avg = (block_start + block_end[np.cumsum(new_block) - 1]) / 2.0 - group_start
    ranks = np.empty(n)
    ranks[order] = avg
    return ranks


Blocks = tuple[
    np.ndarray | None, int
]  # (row permutation, or None when rows already run group by group; G)


def _rows(a: np.ndarray, blocks: Blocks, m: int) -> np.ndarray:
    perm, size = blocks
    return (a if perm is None else a[perm]).reshape(m, size)


def _block_ranks(v: np.ndarray) -> np.ndarray:
    """tie_averaged_ranks for an (M, G) array, one group per row."""
    m, size = v.shape
    if size <= 16:
        # rank = (# smaller) + (# equal - 1) / 2: G passes of (M, G) comparisons beat a per-row sort
        # for small G. Counts of at most 16 fit int8: an eighth of float64's memory traffic.
        below, equal = np.zeros(v.shape, np.int8), np.zeros(v.shape, np.int8)
        for j in range(size):
            col = v[:, j : j + 1]
            below += col < v
            equal += col == v
        return below + (equal - 1) / 2.0
    order = np.argsort(v, axis=1, kind="stable")
    sv = np.take_along_axis(v, order, axis=1)
    pos = np.broadcast_to(np.arange(size), (m, size))
    first = np.ones((m, 1), dtype=bool)
    new_block = np.concatenate([first, sv[:, 1:] != sv[:, :-1]], axis=1)
    last = np.concatenate([new_block[:, 1:], first], axis=1)
    start = np.maximum.accumulate(np.where(new_block, pos, 0), axis=1)
    end = np.minimum.accumulate(np.where(last, pos, size)[:, ::-1], axis=1)[:, ::-1]
    ranks = np.empty((m, size))
    np.put_along_axis(ranks, order, (start + end) / 2.0, axis=1)
    return ranks


def group_spearman(
    old: np.ndarray, new: np.ndarray, gidx: np.ndarray, m: int, blocks: Blocks | None = None
) -> np.ndarray:
    """Spearman correlation of two orderings inside each group (NaN where either is constant):
    tie-averaged ranks, then Pearson on the ranks per group."""
    if blocks is not None:

        def prep(a):
            return _rows(np.nan_to_num(np.asarray(a, dtype=np.float64), nan=-np.inf), blocks, m)  # noqa: E731

        ro, rn = both(lambda: _block_ranks(prep(old)), lambda: _block_ranks(prep(new)), old.size)
        do, dn = ro - ro.mean(axis=1, keepdims=True), rn - rn.mean(axis=1, keepdims=True)
        cov, vo, vn = (do * dn).sum(axis=1), (do * do).sum(axis=1), (dn * dn).sum(axis=1)
    else:
        ro, rn = tie_averaged_ranks(old, gidx), tie_averaged_ranks(new, gidx)
        cnt = np.bincount(gidx, minlength=m).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            do = ro - (np.bincount(gidx, ro, m) / cnt)[gidx]
            dn = rn - (np.bincount(gidx, rn, m) / cnt)[gidx]
        cov, vo, vn = (
            np.bincount(gidx, do * dn, m),
            np.bincount(gidx, do * do, m),
            np.bincount(gidx, dn * dn, m),
        )
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = cov / np.sqrt(vo * vn)
    rho[(vo <= 1e-12) | (vn <= 1e-12)] = np.nan
    return rho


def resolve_weights(
    components: list[ComponentInfo], spec: AblationSpec
) -> tuple[np.ndarray, np.ndarray]:
    """(columns kept, their weights) for a spec: dropped components are removed outright, as if the
    reward function were not there (a rollout only they scored becomes unscorable)."""
    keep = np.array([c.name not in spec.drop for c in components], dtype=bool)
    w = np.array([float(spec.weights.get(c.name, c.weight)) for c in components], dtype=np.float64)
    return keep, w[keep]


def ablate(
    data: RunArrays,
    spec: AblationSpec,
    baseline: Baseline = Baseline(),
    *,
    top: int = 10,
) -> dict[str, Any]:
    """Recompute every group's advantages under `spec` and compare with the run's own (recomputed
    with the same function, so only the spec differs). batch_ids = steps, as in ingestion.

    Returns plain JSON: mean |Δ advantage|, fraction of sign flips among rollouts that had a signal,
    fraction of groups whose unique best completion changes, per-group Spearman of old vs new order,
    the change in zero-std groups, the most affected groups (database ids), and a verdict.
    """
    g, m = dense_ids(data.group_ids)
    blocks: Blocks | None = regular_blocks(g, m)
    layout: dict[str, Any] = {"group_ids": g}
    if blocks is not None:
        # G completions per prompt, as GRPO samples them: line rows up group after group once, then
        # every per-group step is row-wise on an (M, G) array and TRL's group_size layout applies.
        perm, size = blocks
        if not np.array_equal(perm, np.arange(perm.size)):
            data, g = data.select(perm), g[perm]
        blocks, layout = (None, size), {"group_size": size}
    keep, w = resolve_weights(data.components, spec)
    kept = [c for c, k in zip(data.components, keep, strict=True) if k]
    base, new = both(
        lambda: stats.compute_advantages(
            data.matrix,
            data.weights,
            **layout,
            scale_rewards=baseline.scale_rewards,
            aggregation=baseline.aggregation,
            batch_ids=data.steps,
            eps=baseline.eps,
        ),
        lambda: stats.compute_advantages(
            data.matrix[:, keep],
            w,
            **layout,
            scale_rewards=spec.scale_rewards,
            aggregation=spec.aggregation,
            batch_ids=data.steps,
            eps=baseline.eps,
        ),
        data.n,
    )
    a0, a1 = base.advantages, new.advantages
    delta = np.abs(a1 - a0)
    tol = 1e-9
    s0 = np.where(np.abs(a0) > tol, np.sign(a0), 0.0)
    s1 = np.where(np.abs(a1) > tol, np.sign(a1), 0.0)
    had = s0 != 0
    flips = had & (s0 * s1 < 0)
    lost = had & (s1 == 0)
    different, tied, n_unique_best = _best_changed(a0, a1, g, m, tol, blocks)
    rho = group_spearman(a0, a1, g, m, blocks)
    z0, z1 = _zero_std_groups(base, g, m), _zero_std_groups(new, g, m)
    per_group = np.bincount(g, delta, m) / np.maximum(np.bincount(g, minlength=m), 1)
    worst = np.argsort(-per_group, kind="stable")[:top]
    group_db_ids = np.zeros(m, dtype=np.int64)
    group_db_ids[g] = data.group_ids
    group_steps = np.zeros(m, dtype=np.int64)
    group_steps[g] = data.steps
    finite_rho = rho[np.isfinite(rho)]
    out = {
        "n_rollouts": data.n,
        "n_groups": m,
        "weights": {c.name: float(wj) for c, wj in zip(kept, w, strict=True)},
        "dropped": list(spec.drop),
        "mean_abs_delta": float(delta.mean()) if data.n else 0.0,
        "max_abs_delta": float(delta.max()) if data.n else 0.0,
        "sign_flip_frac": float(flips.sum() / had.sum()) if had.any() else 0.0,
        "signal_lost_frac": float(lost.sum() / had.sum()) if had.any() else 0.0,
        # Of the groups with a unique best before: those whose unique best is another completion
        # now, and those where several completions now tie for the best. Apart: a tie is not a
        # new winner (it is what dropping the one component that separated them does).
        "unique_best_groups": n_unique_best,
        "best_different": int(different.sum()),
        "best_tied": int(tied.sum()),
        "best_different_frac": _frac(different.sum(), n_unique_best),
        "best_tied_frac": _frac(tied.sum(), n_unique_best),
        "best_changed_frac": _frac(different.sum() + tied.sum(), n_unique_best),
        "spearman_mean": float(finite_rho.mean()) if finite_rho.size else None,
        "spearman_median": float(np.median(finite_rho)) if finite_rho.size else None,
        "spearman_groups": int(finite_rho.size),
        "zero_std_before": float(z0.mean()) if m else 0.0,
        "zero_std_after": float(z1.mean()) if m else 0.0,
        "zero_std_change": float(z1.mean() - z0.mean()) if m else 0.0,
        "top_groups": [
            {
                "group_id": int(group_db_ids[i]),
                "step": int(group_steps[i]),
                "mean_abs_delta": float(per_group[i]),
                "spearman": _json_float(rho[i]),
            }
            for i in worst
            if per_group[i] > tol
        ],
    }
    out["verdict"] = ablation_verdict(out, spec)
    return out


def _zero_std_groups(res: stats.AdvantageResult, g: np.ndarray, m: int) -> np.ndarray:
    """Groups whose advantages are all zero: nothing to learn from them."""
    nonzero = np.bincount(g, (np.abs(res.advantages) > 1e-9).astype(np.float64), m)
    return nonzero == 0


def _group_max(a: np.ndarray, g: np.ndarray, m: int, blocks: Blocks | None) -> np.ndarray:
    if blocks is not None:
        return _rows(a, blocks, m).max(axis=1)
    mx = np.full(m, -np.inf)
    np.maximum.at(mx, g, a)
    return mx


def _frac(n: Any, of: int) -> float:
    return float(n / of) if of else 0.0


def _best_changed(
    a0: np.ndarray, a1: np.ndarray, g: np.ndarray, m: int, tol: float, blocks: Blocks | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Among groups with a unique best completion before: (those whose unique best is now another
    completion, those where several completions now tie for the best, how many had a unique
    best)."""

    def top_info(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mx = _group_max(a, g, m, blocks)
        at_top = a >= mx[g] - tol
        return mx, np.bincount(g, at_top.astype(np.float64), m)

    mx0, n_top0 = top_info(a0)
    mx1, n_top1 = top_info(a1)
    unique0 = n_top0 == 1
    best_rows = np.flatnonzero((a0 >= mx0[g] - tol) & unique0[g])
    still = np.zeros(m, dtype=bool)
    still[g[best_rows]] = (a1[best_rows] >= mx1[g[best_rows]] - tol) & (n_top1[g[best_rows]] == 1)
    tied = unique0 & (n_top1 > 1)
    return unique0 & ~still & ~tied, tied, int(unique0.sum())


# "(almost) nothing": advantages are in units of a group std, so 0.05 is a twentieth of one std.
NEGLIGIBLE = {
    "mean_abs_delta": 0.05,
    "sign_flip_frac": 0.01,
    "best_different_frac": 0.02,
    "best_tied_frac": 0.02,
    "zero_std_change": 0.01,
}


def best_words(r: dict[str, Any]) -> str:
    """ "a different best in 10 of 115 groups with a unique best, 67 now tied" (ablations saved
    before the split say only how many changed)."""
    if "best_different" not in r:
        return f"best completion changes in {_pct(r['best_changed_frac'])} of groups"
    n = r["unique_best_groups"]
    return (
        f"a different best in {r['best_different']} of {n} groups with a unique best "
        f"({_pct(r['best_different_frac'])}), {r['best_tied']} of {n} now tied "
        f"({_pct(r['best_tied_frac'])})"
    )


def ablation_verdict(r: dict[str, Any], spec: AblationSpec) -> dict[str, str]:
    negligible = all(abs(r.get(k, r["best_changed_frac"])) <= v for k, v in NEGLIGIBLE.items())
    what = (", ".join(f"'{d}'" for d in spec.drop)) if spec.drop else None
    if negligible:
        text = (
            f"Dropping {what} changes (almost) nothing: {NO_SIGNAL}."
            if what
            else "This change leaves the advantages (almost) unchanged: it would not change what "
            "the run learns."
        )
        return {"level": "no_signal", "text": text}
    parts = (
        f"mean |Δ advantage| {r['mean_abs_delta']:.3f}, {_pct(r['sign_flip_frac'])} sign flips, "
        f"{best_words(r)}, zero-std groups "
        f"{_pct(r['zero_std_before'])} → {_pct(r['zero_std_after'])}"
    )
    strong = (
        # A tie counts here: the best completion lost its edge, which changes the group's signal
        # as much as a new winner does; the text says which of the two it was.
        r["sign_flip_frac"] >= 0.1 or r["best_changed_frac"] >= 0.2 or r["mean_abs_delta"] >= 0.5
    )
    subject = f"{what} shaped" if what else "This change reshapes"
    text = f"{subject} the training signal: {parts}."
    return {"level": "strong" if strong else "moderate", "text": text}


def python_loop_advantages(
    rows: list[tuple[int, list[float]]], weights: list[float]
) -> list[float]:
    """The baseline the benchmark compares against: sum-then-normalise per group in plain Python.

    `rows` is [(group id, component values)], grouped by id in any order."""
    groups: dict[int, list[int]] = {}
    for i, (gid, _) in enumerate(rows):
        groups.setdefault(gid, []).append(i)
    out = [0.0] * len(rows)
    for idx in groups.values():
        rewards = [
            sum(w * v for w, v in zip(weights, rows[i][1], strict=True) if v == v) for i in idx
        ]
        n = len(rewards)
        mean = sum(rewards) / n
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1)) if n > 1 else 0.0
        for i, r in zip(idx, rewards, strict=True):
            out[i] = (r - mean) / (std + stats.EPS)
    return out
