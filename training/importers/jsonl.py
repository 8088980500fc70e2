"""JSONL in the ingestion format: one group record per line, exactly what POST
/api/v1/runs/{id}/groups/ takes inside its "groups" list (and what `export_rollouts
--format jsonl` writes).

The offline file of `training.sinks.JsonlSink` is read too: its lines carry a "type" field; "group"
lines are groups, "metrics" lines are per-step metrics ({"step", "values"}), the "settings" header
is the reward settings the trainer trained with (they become the run's), "log" and "progress" lines
are ignored. Records are passed through as they are, except text that Postgres cannot hold (a NUL,
a lone surrogate: U+FFFD, counted, as the recorder's sinks store it) and NaN (null: not scored);
the ingestion service validates them and the import command maps its errors back to the line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import (
    BadRecord,
    GroupItem,
    Item,
    MetricsItem,
    Progress,
    Reader,
    RecordError,
    SettingsItem,
    jsonl_files,
    jsonl_lines,
    parse_json_object,
)

IGNORED_TYPES = ("log", "progress")


@dataclass
class JsonlReader(Reader):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.format = "jsonl"
        self.grouping = "one group per line, as given (step and key from the record)"
        self.advantage = (
            "as given in the records; missing ones computed at ingestion from the components"
        )

    def files(self) -> list[Path]:
        return jsonl_files(self.path)

    def read(self, progress: Progress | None = None) -> Iterator[Item]:
        self.flags = {}  # counts of this pass (sample_components reads the start once before)
        for path in self.files():
            name = str(path)
            for lineno, _, raw in jsonl_lines(path, progress):
                try:
                    item = self._item(parse_json_object(raw), name, lineno)
                except RecordError as e:
                    yield BadRecord(name, lineno, str(e))
                    continue
                if item is not None:
                    yield item

    def _item(
        self, obj: dict[str, Any], name: str, lineno: int
    ) -> GroupItem | MetricsItem | SettingsItem | None:
        kind = obj.pop("type", "group")
        if kind == "group":
            return GroupItem(self.clean(obj), name, lineno)  # a NUL as the recorder stores it
        if kind == "metrics":
            return MetricsItem({"step": obj.get("step"), "values": obj.get("values")}, name, lineno)
        if kind == "settings":
            return SettingsItem(obj, name, lineno)
        if kind in IGNORED_TYPES:
            return None
        raise RecordError(
            f"type: must be group, metrics or settings (or log/progress, ignored), got {kind!r}"
        )

    def sample_components(self, limit: int = 200) -> list[str]:
        names: dict[str, None] = {}
        seen = 0
        for item in self.read():
            if isinstance(item, GroupItem):
                rollouts = item.record.get("rollouts")
                for r in rollouts if isinstance(rollouts, list) else []:
                    if isinstance(r, dict) and isinstance(r.get("rewards"), dict):
                        # Names are kept as written: a name the web app refuses must fail loudly at
                        # its line rather than be silently renamed in an exact-format file.
                        names.update(dict.fromkeys(str(k) for k in r["rewards"]))
                seen += 1
                if seen >= limit:
                    break
        return list(names)
