"""A replay's results: per-rollout arrays, the comparison report and the regression verdict.

`summarise` (run once, by the last worker: queue.py) recomputes both aggregates and advantages
with the run's own weights and settings (training/stats.py), stores the arrays as an npz
(RESULT_KEYS), the headline numbers and the one-line summary. `report` and `regress` read the
stored arrays with the annotations as they are now (analysis.py).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db.models import Sum
from django.utils import timezone

from training import stats
from webapp.errors import Conflict
from webapp.replays import analysis
from webapp.replays.models import Replay, ReplayChunk, ReplayScore
from webapp.rollouts.ingest_stats import run_weights
from webapp.runs.models import Run

RESULT_KEYS = (
    "ids",
    "group_ids",
    "steps",
    "old",
    "new",
    "failed",
    "old_reward",
    "new_reward",
    "old_adv",
    "new_adv",
)


def advantage_settings(run: Run) -> dict[str, Any]:
    """The run's own advantage settings (Run.advantage_settings, the trainer's values), else its job
    config the way diagnostics read it before runs carried them."""
    if hasattr(run, "advantage_settings"):
        return run.advantage_settings()
    cfg = run.config or {}
    return {
        "scale_rewards": cfg.get("scale_rewards") or "group",
        "aggregation": cfg.get("multi_objective_aggregation") or "sum_then_normalize",
        "advantage_epsilon": stats.EPS,
    }


def _positions(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    if ids.size == 0:
        return np.full(wanted.shape, -1, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    at = np.minimum(np.searchsorted(ids, wanted, sorter=order), max(ids.size - 1, 0))
    found = ids[order[at]] == wanted if ids.size else np.zeros(wanted.shape, dtype=bool)
    return np.where(found, order[at], -1)


def compute_results(replay: Replay) -> dict[str, np.ndarray]:
    """Per rollout of the stored chunks: original and replayed component matrices, both
    aggregates and both advantages, recomputed with the run's own weights and settings by
    the shared function."""
    from webapp.diagnostics.services import load_run_arrays

    run = replay.run
    comps = run.components()
    data = load_run_arrays(run)
    groups = [
        g
        for ids in ReplayChunk.objects.filter(
            replay=replay, status=ReplayChunk.Status.DONE
        ).values_list("group_ids", flat=True)
        for g in ids
    ]
    keep = np.isin(data.group_ids, np.array(groups, dtype=np.int64))
    ids, gids, steps = data.rollout_ids[keep], data.group_ids[keep], data.steps[keep]
    old = data.matrix[keep]
    new = old.copy()
    failed = np.zeros(ids.size, dtype=bool)
    col = {c.id: j for j, c in enumerate(comps)}
    for cid in {c.id for c in comps if c.name in replay.components()}:
        rows = np.array(
            list(
                ReplayScore.objects.filter(replay=replay, component_id=cid).values_list(
                    "rollout_id", "value", "ok"
                )
            ),
            dtype=np.float64,
        ).reshape(-1, 3)
        at = _positions(ids, rows[:, 0].astype(np.int64))
        ok = at >= 0
        new[at[ok], col[cid]] = rows[ok, 1]
        failed[at[ok]] |= rows[ok, 2] == 0
    weights = run_weights(run, comps)
    s = advantage_settings(run)
    kw = {
        "scale_rewards": s["scale_rewards"],
        "aggregation": s["aggregation"],
        "batch_ids": steps,
        "eps": s.get("advantage_epsilon", stats.EPS),
    }
    before = stats.compute_advantages(old, weights, gids, **kw) if ids.size else None
    after = stats.compute_advantages(new, weights, gids, **kw) if ids.size else None
    empty = np.zeros(0)
    return {
        "ids": ids,
        "group_ids": gids,
        "steps": steps,
        "old": old,
        "new": new,
        "failed": failed,
        "old_reward": before.rewards if before else empty,
        "new_reward": after.rewards if after else empty,
        "old_adv": before.advantages if before else empty,
        "new_adv": after.advantages if after else empty,
    }


def pack_results(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def load_results(replay: Replay) -> dict[str, np.ndarray] | None:
    if replay.results is None:
        return None
    with np.load(io.BytesIO(bytes(replay.results)), allow_pickle=False) as z:
        return {k: z[k] for k in RESULT_KEYS}


def _compare(replay: Replay, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    comps = replay.run.components()
    return analysis.compare(
        arrays,
        [c.name for c in comps],
        replay.components(),
        run_weights(replay.run, comps),
        analysis.regression_labels(replay.run_id),
    )


def summarise(replay: Replay) -> None:
    """Store the result arrays, the headline numbers and the one-line summary; succeeded unless
    a chunk failed."""
    arrays = compute_results(replay)
    report = _compare(replay, arrays)
    failed_chunks = list(
        ReplayChunk.objects.filter(replay=replay, status=ReplayChunk.Status.FAILED).values_list(
            "error", flat=True
        )
    )
    scored = ReplayChunk.objects.filter(replay=replay, status=ReplayChunk.Status.DONE).aggregate(
        n=Sum("n_rollouts")
    )
    line = analysis.summary_line(report, replay, scored["n"] or 0, len(failed_chunks))
    status = Replay.Status.FAILED if failed_chunks else Replay.Status.SUCCEEDED
    error = (
        f"{len(failed_chunks)} of {replay.n_chunks} chunks failed; first: {failed_chunks[0]}"
        if failed_chunks
        else ""
    )
    Replay.objects.filter(id=replay.id).update(
        results=pack_results(arrays),
        stats=report["headline"],
        summary=line[:500],
        status=status,
        error=error[:2000],
        finished_at=timezone.now(),
    )


def report(replay: Replay) -> dict[str, Any] | None:
    """The comparison shown by the page, the API and reward_regress, from the stored arrays and the
    annotations as they are now (an annotation added after the replay counts at once)."""
    arrays = load_results(replay)
    if arrays is None:
        return None
    return _compare(replay, arrays)


@dataclass
class Regression:
    ok: bool  # no annotated reward hack outranks its group's median under the new reward
    headline: dict[str, Any]
    rows: list[dict[str, Any]]


def regress(replay: Replay) -> Regression:
    """The negative-test verdict of a finished replay (reward_regress and the API). Conflict when
    the replay has no results to judge."""
    if (
        replay.status not in (Replay.Status.SUCCEEDED, Replay.Status.FAILED)
        or replay.results is None
    ):
        raise Conflict(
            "replay", f"replay {replay.id} is {replay.status}: it has no results to check yet"
        )
    rep = report(replay)
    assert rep is not None
    return Regression(
        ok=not any(r["regression"] for r in rep["regression"]),
        headline=rep["headline"],
        rows=rep["regression"],
    )


def current_summary(replay: Replay, report: dict[str, Any]) -> str:
    """The replay's one-line summary recomputed from `report` (the annotations as they are now):
    the stored `summary` is the line as it stood when the replay finished."""
    chunks = ReplayChunk.objects.filter(replay=replay)
    scored = chunks.filter(status=ReplayChunk.Status.DONE).aggregate(n=Sum("n_rollouts"))["n"]
    failed = chunks.filter(status=ReplayChunk.Status.FAILED).count()
    return analysis.summary_line(report, replay, scored or 0, failed)
