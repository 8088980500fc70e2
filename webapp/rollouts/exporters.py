"""Export a run's rollouts: JSONL in the ingestion group format (re-importable with
`import_rollouts --format jsonl` or POST /api/v1/runs/{id}/groups/), and a Hugging Face `datasets`
folder (parquet, one row per rollout) that `datasets.load_dataset(folder)` reads.

Everything streams: groups are read in chunks ordered by id with a keyset (`id > last`), rollouts
and scores only for the chunk at hand, so memory stays flat at any run size. The page that offers a
download calls the same generators.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from training.records import GroupRecord, RolloutRecord, Score
from webapp.explorer.params import ExplorerQuery
from webapp.explorer.query import explore
from webapp.rollouts.models import Group, RewardScore, Rollout
from webapp.runs.models import Run

CHUNK_GROUPS = 200  # groups per database round trip
HF_DATA_FILE = (
    "data/rollouts-00000-of-00001.parquet"  # the Hub's layout: load_dataset(folder) finds it
)


@dataclass
class GroupFilter:
    step_min: int | None = None
    step_max: int | None = None
    split: str | None = None
    zero_std_only: bool = False


def _groups(run: Run, f: GroupFilter, chunk: int) -> Iterator[list[Group]]:
    qs = Group.objects.filter(run=run)
    if f.step_min is not None:
        qs = qs.filter(step__gte=f.step_min)
    if f.step_max is not None:
        qs = qs.filter(step__lte=f.step_max)
    if f.split:
        qs = qs.filter(split=f.split)
    if f.zero_std_only:
        qs = qs.filter(zero_std=True)
    last = 0
    while True:
        page = list(qs.filter(id__gt=last).order_by("id")[:chunk])
        if not page:
            return
        yield page
        last = page[-1].id


def _scores(rollout_ids: list[int]) -> dict[int, dict[str, tuple[float | None, str]]]:
    out: dict[int, dict[str, tuple[float | None, str]]] = {i: {} for i in rollout_ids}
    rows = RewardScore.objects.filter(rollout_id__in=rollout_ids).values_list(
        "rollout_id", "component__name", "value", "reason"
    )
    for rid, name, value, reason in rows:
        out[rid][name] = (value, reason)
    return out


def _rollout_record(r: Rollout, scores: dict[str, tuple[float | None, str]]) -> RolloutRecord:
    return RolloutRecord(
        index=r.index,
        transcript=r.transcript,
        # A reason travels as {value, reason}; a bare value stays a number (the compact form).
        rewards={n: (Score(v, why) if why else v) for n, (v, why) in scores.items()},
        reward=r.reward,
        advantage=r.advantage,
        length=r.length,
        truncated=r.truncated,
        finish_reason=r.finish_reason or None,
        parse_error=r.parse_error or None,
        state=r.state,
    )


def iter_group_records(
    run: Run, filters: GroupFilter | None = None, chunk: int = CHUNK_GROUPS
) -> Iterator[dict]:
    """Every group of the run (filtered) in the ingestion format, in id order."""
    for groups in _groups(run, filters or GroupFilter(), chunk):
        rollouts = list(
            Rollout.objects.filter(group_id__in=[g.id for g in groups]).order_by(
                "group_id", "index"
            )
        )
        scores = _scores([r.id for r in rollouts])
        by_group: dict[int, list[Rollout]] = {}
        for r in rollouts:
            by_group.setdefault(r.group_id, []).append(r)
        for g in groups:
            yield GroupRecord(
                step=g.step,
                key=g.key,
                prompt=g.prompt,
                split=g.split,
                rollouts=[_rollout_record(r, scores[r.id]) for r in by_group.get(g.id, [])],
            ).to_json()


def write_jsonl(run: Run, out: IO[str], filters: GroupFilter | None = None) -> int:
    """Write one group per line; returns the number of groups."""
    n = 0
    for rec in iter_group_records(run, filters):
        out.write(json.dumps(rec, ensure_ascii=False) + "\n")
        n += 1
    return n


# ------------------------------------------------------------------------------------- Hugging Face


def _components(run: Run) -> list[str]:
    return [c.name for c in run.components()]


def hf_schema(components: list[str]) -> pa.Schema:
    """Fixed columns, then one float column per component ("rewards/<name>", null when not scored).
    Prompt and transcript are JSON strings: chat messages vary in their keys (tool calls), which a
    fixed parquet struct cannot hold."""
    return pa.schema(
        [
            ("run", pa.string()),
            ("step", pa.int64()),
            ("group_key", pa.string()),
            ("split", pa.string()),
            ("index", pa.int64()),
            ("prompt", pa.string()),
            ("prompt_messages", pa.string()),
            ("completion", pa.string()),
            ("transcript", pa.string()),
            ("reward", pa.float64()),
            ("advantage", pa.float64()),
            ("length", pa.int64()),
            ("truncated", pa.bool_()),
            ("group_reward_std", pa.float64()),
            *[(f"rewards/{c}", pa.float64()) for c in components],
        ]
    )


def _hf_row(
    run: Run,
    g: Group,
    r: Rollout,
    scores: dict[str, tuple[float | None, str]],
    components: list[str],
) -> dict[str, Any]:
    row = {
        "run": run.name,
        "step": r.step,
        "group_key": g.key,
        "split": r.split,
        "index": r.index,
        "prompt": g.prompt_text,
        "prompt_messages": json.dumps(g.prompt, ensure_ascii=False),
        "completion": r.completion,
        "transcript": json.dumps(r.transcript, ensure_ascii=False),
        "reward": r.reward,
        "advantage": r.advantage,
        "length": r.length,
        "truncated": r.truncated,
        "group_reward_std": g.reward_std,
    }
    for c in components:
        row[f"rewards/{c}"] = scores.get(c, (None, ""))[0]
    return row


def iter_hf_rows(
    run: Run,
    filters: GroupFilter | None = None,
    query: ExplorerQuery | None = None,
    chunk: int = CHUNK_GROUPS,
) -> Iterator[list[dict[str, Any]]]:
    """Chunks of flat rows. With an explorer `query`, rows come in its order (sort by any
    component, the reward, the advantage or the length), page by page through its keyset cursor;
    otherwise in group order."""
    components = _components(run)
    if query is not None:
        yield from _explorer_rows(run, query, components)
        return
    for groups in _groups(run, filters or GroupFilter(), chunk):
        by_id = {g.id: g for g in groups}
        rollouts = list(
            Rollout.objects.filter(group_id__in=list(by_id)).order_by("group_id", "index")
        )
        scores = _scores([r.id for r in rollouts])
        yield [_hf_row(run, by_id[r.group_id], r, scores[r.id], components) for r in rollouts]


def _explorer_rows(
    run: Run, query: ExplorerQuery, components: list[str]
) -> Iterator[list[dict[str, Any]]]:
    query.cursor = None
    while True:
        page = explore(run, query)
        rollouts = [row.rollout for row in page.rows]
        groups = Group.objects.in_bulk({r.group_id for r in rollouts})
        scores = _scores([r.id for r in rollouts])
        if rollouts:
            yield [_hf_row(run, groups[r.group_id], r, scores[r.id], components) for r in rollouts]
        if not page.next_cursor:
            return
        query.cursor = page.next_cursor


def write_hf(
    run: Run,
    folder: str | Path,
    filters: GroupFilter | None = None,
    query: ExplorerQuery | None = None,
) -> int:
    """Write a `datasets`-loadable folder: data/*.parquet (one row group per chunk) and a README
    with the dataset card's config. Returns the number of rows; with none, nothing is written."""
    folder = Path(folder)
    path = folder / HF_DATA_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    components = _components(run)
    schema = hf_schema(components)
    n = 0
    with pq.ParquetWriter(path, schema) as writer:
        for rows in iter_hf_rows(run, filters, query):
            writer.write_table(pa.Table.from_pylist(rows, schema=schema))
            n += len(rows)
    if n == 0:
        # `datasets` cannot load a split without rows: write nothing rather than a
        # folder it refuses.
        path.unlink()
        return 0
    (folder / "README.md").write_text(_card(run, components, n), encoding="utf-8")
    return n


def _card(run: Run, components: list[str], n: int) -> str:
    return (
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        f"    path: {HF_DATA_FILE}\n---\n\n"
        f"# Rollouts of run {run.name!r}\n\n{n} rollouts, one per row. Reward components: "
        f"{', '.join(components) or 'none'} (columns `rewards/<name>`, null when not scored). "
        "`prompt_messages` and `transcript` are JSON-encoded chat messages.\n\n"
        '```python\nimport datasets\nds = datasets.load_dataset("path/to/this/folder", '
        'split="train")\n```\n'
    )
