"""The rows a batch stores, built once for the four tables it fills, ids included.

Tuples in each table's column order, ready for Postgres COPY or an executemany INSERT (the writer,
webapp/rollouts/ingest_write.py, picks): NULL is None, JSON columns are JSON text, each group's
packed score matrix (Group.packed_scores) is built here from the rollout ids drawn for the batch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from webapp.rollouts import packed, text
from webapp.rollouts.ingest_stats import BatchStats, stored_zero_std
from webapp.rollouts.models import Group, GroupComponentStat, RewardComponent, RewardScore, Rollout
from webapp.rollouts.validation import GroupIn, derive_text

GROUP_COLUMNS = (
    "id",
    "run_id",
    "step",
    "key",
    "prompt",
    "prompt_text",
    "split",
    "size",
    "reward_mean",
    "reward_std",
    "zero_std",
    "all_unscorable",
    "packed_scores",
    "packed_components",
)
ROLLOUT_COLUMNS = (
    "id",
    "group_id",
    "run_id",
    "step",
    "split",
    "index",
    "transcript",
    "completion",
    "reward",
    "advantage",
    "length",
    "truncated",
    "finish_reason",
    "parse_error",
    "state",
    "preview_head",
    "preview_tail",
    "n_turns",
    "n_tool_calls",
    "text_chars",
    "search_text",
    "search_words",
)
SCORE_COLUMNS = ("rollout_id", "component_id", "run_id", "step", "value", "reason")
STAT_COLUMNS = (
    "group_id",
    "component_id",
    "run_id",
    "step",
    "count",
    "mean",
    "std",
    "min",
    "max",
    "zero_std",
)
# (reward_mean, reward_std, zero_std, all_unscorable): what a group's statistics set on its row.
GROUP_STAT_COLUMNS = GROUP_COLUMNS[8:12]


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    rows: Iterable[tuple]  # a list, or (the rollouts) rows built as the writer reads them


def dumps(value: Any) -> str:
    """JSON text for a jsonb column: orjson (several times faster than json; NaN and infinities
    become null, which jsonb accepts, where json.dumps wrote NaN, which it refuses); json for what
    orjson cannot encode (integers past 64 bits, non-string keys are kept as their str)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(value, default=str)


def _nullable(values: np.ndarray) -> list[float | None]:
    """Python floats, None where not finite (NaN, overflow)."""
    return [v if math.isfinite(v) else None for v in values.tolist()]


def batch_rows(
    run_id: int,
    groups: list[GroupIn],
    comps: list[RewardComponent],
    s: BatchStats,
    group_ids: list[int],
    rollout_ids: list[int],
) -> list[Table]:
    """The rows of a validated batch, in insertion order (rollouts after their group)."""
    return [
        Table(
            Group._meta.db_table,
            GROUP_COLUMNS,
            _group_rows(run_id, groups, comps, s, group_ids, rollout_ids),
        ),
        *_rollout_and_score_rows(run_id, groups, comps, s, group_ids, rollout_ids),
        Table(
            GroupComponentStat._meta.db_table, STAT_COLUMNS, stat_rows(run_id, comps, s, group_ids)
        ),
    ]


def group_stats(s: BatchStats) -> list[tuple]:
    """GROUP_STAT_COLUMNS of each group, in batch order."""
    return list(
        zip(
            _nullable(s.agg.mean),
            _nullable(s.agg.std),
            s.group_zero_std.tolist(),
            (s.agg.count == 0).tolist(),
            strict=True,
        )
    )


def _group_rows(
    run_id: int,
    groups: list[GroupIn],
    comps: list[RewardComponent],
    s: BatchStats,
    group_ids: list[int],
    rollout_ids: list[int],
) -> list[tuple]:
    lengths = np.array([r.length for g in groups for r in g.rollouts], dtype=np.float64)
    sizes = [len(g.rollouts) for g in groups]
    blobs = packed.pack_groups(np.asarray(rollout_ids, dtype=np.int64), lengths, s.matrix, sizes)
    header = packed.header([c.id for c in comps])
    return [
        (
            gid,
            run_id,
            g.step,
            g.key,
            dumps(g.prompt),
            g.prompt_text,
            g.split,
            size,
            *st,
            blob,
            header,
        )
        for gid, g, size, st, blob in zip(
            group_ids, groups, sizes, group_stats(s), blobs, strict=True
        )
    ]


def _rollout_and_score_rows(
    run_id: int,
    groups: list[GroupIn],
    comps: list[RewardComponent],
    s: BatchStats,
    group_ids: list[int],
    rollout_ids: list[int],
) -> tuple[Table, Table]:
    # The hot loop of ingestion (N rollouts, N x K scores): plain lists, no numpy scalars.
    reward, advantage, matrix = _nullable(s.reward), _nullable(s.advantage), s.matrix.tolist()
    columns = [(j, c.id, c.name) for j, c in enumerate(comps)]
    scores = []
    i = 0
    for g in groups:
        step = g.step
        for r in g.rollouts:
            rid, values, given = rollout_ids[i], matrix[i], r.rewards
            for j, cid, name in columns:
                got = given.get(name)
                if got is not None:  # a score row for each component sent, null or not
                    v = values[j]
                    scores.append((rid, cid, run_id, step, None if v != v else v, got[1]))
            i += 1
    rollouts = _rollout_rows(run_id, groups, group_ids, rollout_ids, reward, advantage)
    return (
        Table(Rollout._meta.db_table, ROLLOUT_COLUMNS, rollouts),
        Table(RewardScore._meta.db_table, SCORE_COLUMNS, scores),
    )


def _rollout_rows(
    run_id: int,
    groups: list[GroupIn],
    group_ids: list[int],
    rollout_ids: list[int],
    reward: list[float | None],
    advantage: list[float | None],
) -> Iterator[tuple]:
    """The rollout rows, each rollout's text derived (validation.derive_text) as its row is read:
    fed to a COPY, Python derives the next rollout's text while Postgres stores the last one
    (compression, indexes) on the other core."""
    i = 0
    for gid, g in zip(group_ids, groups, strict=True):
        step = g.step
        for r in g.rollouts:
            derive_text(g, r)
            rid, sm = rollout_ids[i], r.summary
            yield (
                rid,
                gid,
                run_id,
                step,
                g.split,
                r.index,
                dumps(r.transcript),
                r.completion,
                reward[i],
                advantage[i],
                r.length,
                r.truncated,
                r.finish_reason,
                r.parse_error,
                None if r.state is None else dumps(r.state),
                sm.head,
                sm.tail,
                sm.turns,
                sm.tool_calls,
                sm.chars,
                r.search_text,
                text.words_tsvector(run_id, r.search_words),
            )
            i += 1


def stat_rows(
    run_id: int, comps: list[RewardComponent], s: BatchStats, group_ids: list[int]
) -> list[tuple]:
    """GroupComponentStat rows: one per group and component that scored at least one
    rollout of it."""
    cs = s.comp
    gi, j = np.nonzero(cs.count > 0)  # row-major: group by group, components in order
    zero = stored_zero_std(cs.std[gi, j])
    return list(
        zip(
            np.asarray(group_ids, dtype=np.int64)[gi].tolist(),
            np.array([c.id for c in comps], dtype=np.int64)[j].tolist(),
            [run_id] * len(gi),
            s.group_steps[gi].tolist(),
            cs.count[gi, j].astype(np.int64).tolist(),
            _nullable(cs.mean[gi, j]),
            _nullable(cs.std[gi, j]),
            _nullable(cs.min[gi, j]),
            _nullable(cs.max[gi, j]),
            zero.tolist(),
            strict=True,
        )
    )
