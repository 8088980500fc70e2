"""A new importer is one module: a Reader that builds its groups with `group_record` (the typed
record, training/records.py), registered in READERS. This one reads a CSV of
step,prompt,completion,correct and its groups are ingested as they come."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from training import importers
from training.importers.base import (
    BadRecord,
    GroupItem,
    Item,
    Reader,
    RecordError,
    fill_advantages,
    group_record,
)
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Rollout


@dataclass
class ToyCsvReader(Reader):
    def files(self) -> list[Path]:
        return [self.path]

    def read(self, progress=None) -> Iterator[Item]:
        with open(self.path, newline="") as f:
            rows = list(csv.DictReader(f))
        by_group: dict[tuple[int, str], list[dict]] = {}
        for row in rows:
            by_group.setdefault((int(row["step"]), row["prompt"]), []).append(row)
        for (step, prompt), members in by_group.items():
            rollouts = [
                {
                    "completion": r["completion"],
                    "rewards": {"correct": float(r["correct"]) if r["correct"] else "?"},
                    "reward": float(r["correct"]) if r["correct"] else None,
                }
                for r in members
            ]
            try:
                fill_advantages(rollouts)
                record = group_record(step, f"p-{prompt}", prompt, rollouts)
            except (RecordError, TypeError) as e:
                yield BadRecord(str(self.path), None, str(e), records=len(members))
                continue
            yield GroupItem(record, str(self.path), 1)

    def sample_components(self, limit: int = 200) -> list[str]:
        return ["correct"]


def _csv(tmp_path, rows):
    path = tmp_path / "toy.csv"
    path.write_text("step,prompt,completion,correct\n" + "".join(f"{r}\n" for r in rows))
    return path


def test_a_toy_importer_on_the_record_type_produces_ingestible_groups(tmp_path, run, monkeypatch):
    monkeypatch.setitem(importers.READERS, "toy-csv", ToyCsvReader)
    path = _csv(tmp_path, ["0,2+2,4,1", "0,2+2,5,0", "1,3+3,6,1", "1,3+3,7,0.5"])
    items = list(importers.open_reader("toy-csv", path).read())
    assert all(isinstance(i, GroupItem) for i in items)
    result = ingest_groups(run, {"groups": [i.record for i in items]})
    assert (result.groups, result.rollouts) == (2, 4)
    stored = Rollout.objects.filter(run=run).order_by("step", "index")
    assert [r.reward for r in stored] == [1.0, 0.0, 1.0, 0.5]
    assert [round(r.advantage, 3) for r in stored] == [0.707, -0.707, 0.707, -0.707]


def test_a_bad_field_is_named_by_its_path(tmp_path, run):
    path = _csv(tmp_path, ["0,2+2,4,1", "0,2+2,5,"])
    (item,) = ToyCsvReader(path).read()
    assert isinstance(item, BadRecord)
    assert item.message.startswith("rollouts[1].rewards.correct: must be a finite number")
