"""Original vs replayed reward: the comparisons the replay page, the API and `reward_regress` show.

Pure numpy over the result arrays (results.RESULT_KEYS), except `regression_labels`, which reads
the annotations. Ranks inside a group are competition ranks on the aggregate reward: 1 = best, tied
completions share a rank, an unscorable completion (NaN reward) ranks last.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from training import diagnostics as dg
from training import stats

TOL = 1e-9
TOP = 50  # rows in each list on the page
# The annotation labels the regression table follows: a hack and a false positive should lose their
# rank under a better reward, a false negative should gain.
KINDS = {
    "reward-hacking": "reward hack",
    "false-positive-reward": "false positive",
    "false-negative-reward": "false negative",
}
HACK = "reward hack"


def regression_labels(run_id: int) -> dict[int, str]:
    """{rollout id: kind} of the run's rollouts annotated with a regression label (a hack wins
    over the others)."""
    from webapp.annotations.models import Annotation

    out: dict[int, str] = {}
    order = list(KINDS)
    rows = Annotation.objects.filter(rollout__run_id=run_id, label__slug__in=order).values_list(
        "rollout_id", "label__slug"
    )
    for rid, slug in rows:
        if rid not in out or order.index(slug) < order.index(
            next(k for k, v in KINDS.items() if v == out[rid])
        ):
            out[rid] = KINDS[slug]
    return out


def group_ranks(values: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Competition rank (1 = highest) of each value inside its group; NaN ranks last."""
    v = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=-np.inf)
    n = v.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((-v, g))
    gs, vs = g[order], v[order]
    idx = np.arange(n)
    new_group = np.r_[True, gs[1:] != gs[:-1]]
    new_value = new_group | np.r_[True, vs[1:] != vs[:-1]]
    group_start = np.maximum.accumulate(np.where(new_group, idx, 0))
    value_start = np.maximum.accumulate(np.where(new_value, idx, 0))
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = value_start - group_start + 1
    return ranks


def _column_stats(col: np.ndarray, g: np.ndarray, m: int) -> dict[str, float | None]:
    st = stats.group_stats(col, g, m)
    finite = col[np.isfinite(col)]
    std = st.std[np.isfinite(st.std)]
    return {
        "mean": float(finite.mean()) if finite.size else None,
        "within_std": float(std.mean()) if std.size else None,
        "zero_std_frac": _f(stats.zero_std_fraction(col, g)) if col.size else None,
    }


def _f(x: Any) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def _hist(old: np.ndarray, new: np.ndarray, bins: int = 12) -> dict[str, list[float]]:
    both = np.concatenate([old[np.isfinite(old)], new[np.isfinite(new)]])
    if not both.size:
        return {"edges": [], "old": [], "new": []}
    lo, hi = float(both.min()), float(both.max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    return {
        "edges": edges.tolist(),
        "old": np.histogram(old[np.isfinite(old)], edges)[0].tolist(),
        "new": np.histogram(new[np.isfinite(new)], edges)[0].tolist(),
    }


def component_table(
    a: dict[str, np.ndarray],
    names: list[str],
    replayed: list[str],
    weights: np.ndarray,
    g: np.ndarray,
    m: int,
) -> list[dict[str, Any]]:
    """Per component (and the aggregate reward): mean, within-group std, zero-std fraction, share of
    the advantage, histogram, original vs replay."""
    shares = {}
    for side in ("old", "new"):
        cov, _ = (
            dg.within_group_cov(a[side], g, m)
            if a[side].size
            else (np.zeros((len(names),) * 2), None)
        )
        shares[side] = dg.advantage_shares(weights, cov)
    rows = []
    for j, name in enumerate(names):
        row = {"name": name, "replayed": name in replayed, "weight": float(weights[j])}
        for side in ("old", "new"):
            row[side] = {**_column_stats(a[side][:, j], g, m), "share": _f(shares[side][j])}
        row["hist"] = _hist(a["old"][:, j], a["new"][:, j])
        rows.append(row)
    agg = {
        "name": "aggregate reward",
        "replayed": True,
        "weight": None,
        "old": {**_column_stats(a["old_reward"], g, m), "share": 1.0},
        "new": {**_column_stats(a["new_reward"], g, m), "share": 1.0},
        "hist": _hist(a["old_reward"], a["new_reward"]),
    }
    return [*rows, agg]


def regression_table(
    a: dict[str, np.ndarray], labels: dict[int, str], g: np.ndarray
) -> list[dict[str, Any]]:
    """One row per annotated rollout: rank in its group before and after, and whether it still beats
    the group's median under the new reward (the `reward_regress` check for hacks)."""
    if not labels or not a["ids"].size:
        return []
    r0, r1 = group_ranks(a["old_reward"], g), group_ranks(a["new_reward"], g)
    sizes = np.bincount(g)
    order = np.argsort(g, kind="stable")
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    new = np.nan_to_num(a["new_reward"], nan=-np.inf)
    rows = []
    for i in np.flatnonzero(np.isin(a["ids"], np.fromiter(labels, dtype=np.int64))):
        members = order[starts[g[i]] : starts[g[i]] + sizes[g[i]]]
        median = float(np.median(new[members]))
        kind = labels[int(a["ids"][i])]
        above = bool(new[i] > median + TOL)
        rows.append(
            {
                "rollout_id": int(a["ids"][i]),
                "group_id": int(a["group_ids"][i]),
                "step": int(a["steps"][i]),
                "kind": kind,
                "size": int(sizes[g[i]]),
                "rank_before": int(r0[i]),
                "rank_after": int(r1[i]),
                "reward_before": _f(a["old_reward"][i]),
                "reward_after": _f(a["new_reward"][i]),
                "median_after": _f(median),
                "above_median_after": above,
                "regression": kind == HACK and above,
            }
        )
    return sorted(rows, key=lambda r: (r["kind"] != HACK, not r["regression"], r["rollout_id"]))


def _best_changed(
    a: dict[str, np.ndarray], g: np.ndarray, m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of the groups with a unique best completion before: (those whose best is no longer that one,
    uniquely; of those, the ones where several completions now tie for the best; the groups with a
    unique best before)."""
    r0, r1 = group_ranks(a["old_reward"], g), group_ranks(a["new_reward"], g)
    unique0 = np.bincount(g, (r0 == 1).astype(np.float64), m) == 1
    unique1 = np.bincount(g, (r1 == 1).astype(np.float64), m) == 1
    kept = np.zeros(m, dtype=bool)
    best = np.flatnonzero((r0 == 1) & unique0[g])
    kept[g[best]] = (r1[best] == 1) & unique1[g[best]]
    changed = unique0 & ~kept
    return changed, changed & ~unique1, unique0


def compare(
    a: dict[str, np.ndarray],
    names: list[str],
    replayed: list[str],
    weights: np.ndarray,
    labels: dict[int, str],
) -> dict[str, Any]:
    g, m = dg.dense_ids(a["group_ids"])
    d_reward = np.nan_to_num(a["new_reward"], nan=0.0) - np.nan_to_num(a["old_reward"], nan=0.0)
    cols = [j for j, n in enumerate(names) if n in replayed]
    changed = (
        (np.abs(np.nan_to_num(a["new"][:, cols] - a["old"][:, cols], nan=1.0)) > TOL).any(axis=1)
        if a["ids"].size
        else np.zeros(0, dtype=bool)
    )
    s0 = np.where(np.abs(a["old_adv"]) > TOL, np.sign(a["old_adv"]), 0.0)
    s1 = np.where(np.abs(a["new_adv"]) > TOL, np.sign(a["new_adv"]), 0.0)
    flips = (s0 * s1) < 0
    none = np.zeros(0, dtype=bool)
    best, tied, unique = _best_changed(a, g, m) if m else (none, none, none)
    group_db = np.zeros(m, dtype=np.int64)
    group_db[g] = a["group_ids"]
    regression = regression_table(a, labels, g)
    hacks = [r for r in regression if r["kind"] == HACK]
    top = np.argsort(-np.abs(d_reward), kind="stable")[:TOP]
    flip_rows = np.flatnonzero(flips)
    flip_rows = flip_rows[
        np.argsort(-np.abs(a["new_adv"][flip_rows] - a["old_adv"][flip_rows]), kind="stable")
    ][:TOP]
    headline = {
        "n_rollouts": int(a["ids"].size),
        "n_groups": int(m),
        "n_changed": int(changed.sum()),
        "n_failed": int(a["failed"].sum()),
        "best_changed": int(best.sum()),  # of them tied: a tie is not a new winner
        "best_different": int((best & ~tied).sum()),
        "best_tied": int(tied.sum()),
        "unique_best": int(unique.sum()),  # the denominator of both
        "sign_flips": int(flips.sum()),
        "with_signal": int((s0 != 0).sum()),
        "hacks": len(hacks),
        "hacks_still_best": sum(r["rank_after"] == 1 for r in hacks),
        "hacks_best_before": sum(r["rank_before"] == 1 for r in hacks),
        "hacks_above_median": sum(r["regression"] for r in hacks),
        "annotated": len(regression),
    }
    return {
        "headline": headline,
        "components": component_table(a, names, replayed, weights, g, m),
        "best_changed_groups": group_db[best][:TOP].tolist() if m else [],
        "flips": [_row(a, i) for i in flip_rows],
        "top_changes": [_row(a, i) for i in top if abs(d_reward[i]) > TOL],
        "regression": regression,
    }


def _row(a: dict[str, np.ndarray], i: int) -> dict[str, Any]:
    return {
        "rollout_id": int(a["ids"][i]),
        "group_id": int(a["group_ids"][i]),
        "step": int(a["steps"][i]),
        "reward_before": _f(a["old_reward"][i]),
        "reward_after": _f(a["new_reward"][i]),
        "adv_before": _f(a["old_adv"][i]),
        "adv_after": _f(a["new_adv"][i]),
        "delta": _f(np.nan_to_num(a["new_reward"][i]) - np.nan_to_num(a["old_reward"][i])),
        "failed": bool(a["failed"][i]),
    }


def _best_words(h: dict[str, Any]) -> str:
    if "unique_best" not in h:  # a headline stored before ties were told apart
        return f"best completion changed in {h['best_changed']:,} of {h['n_groups']:,} groups"
    n = h["unique_best"]
    return (
        f"a different best in {h['best_different']:,} of {n:,} groups with a unique best, "
        f"{h['best_tied']:,} of {n:,} now tied"
    )


def summary_line(report: dict[str, Any], replay: Any, scored: int, failed_chunks: int) -> str:
    h = report["headline"]
    parts = [
        f"replayed {scored:,} of {replay.total:,} rollouts with {replay.name}",
        f"{h['n_changed']:,} changed",
        f"{h['n_failed']:,} failed",
        f"{h['sign_flips']:,} advantage sign flips",
        _best_words(h),
    ]
    if h["hacks"]:
        parts.append(
            f"reward hacks still ranked best in their group: {h['hacks_still_best']} of "
            f"{h['hacks']}"
        )
    if failed_chunks:
        parts.append(f"{failed_chunks} chunks failed")
    return "; ".join(parts)
