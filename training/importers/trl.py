"""TRL completion logs: the `completions/completions_<global_step:05d>.parquet` files that
`GRPOTrainer` writes at every logging step with `GRPOConfig(log_completions=True)`.

One row per completion: prompt, completion, one column per reward function, advantage. Groups
are TRL's own: every G consecutive rows of one prompt. The recorder's `reward_settings.json`,
found beside or above the files, gives the components, weights and G; without it, missing
weights are flagged, never assumed. Columns and rules: docs/integrations.md, "Module notes".
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..sinks import SETTINGS_FILE
from ..stats import weighted_reward
from .base import (
    BadRecord,
    GroupItem,
    Item,
    Progress,
    Reader,
    ReaderError,
    RecordError,
    chunk_group,
    completion_fields,
    component_name,
    finite_or_none,
    group_record,
    int_field,
    is_number,
    prompt_value,
    stable_hash,
)

KNOWN = ("step", "prompt", "completion", "advantage")
RECORDER_EXTRA = (
    "recorder/",
    "reason/",
)  # the RolloutRecorder's log_extra columns: never reward functions
ROWS_PER_BATCH = 1024  # parquet rows decoded at a time: memory stays flat whatever the file size
_STEP_IN_NAME = re.compile(r"completions_(\d+)\.parquet$")


@dataclass
class TRLReader(Reader):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.format = "trl"
        self.grouping = (
            "grouped by identical prompt within step, consecutive rows "
            "(TRL log_completions parquet has no group id)"
        )
        self.advantage = "given: TRL's advantage column"
        self.duplicates: list[
            str
        ] = []  # files skipped as a repeat of the previous generation batch
        self.settings_file, self._settings = _find_settings(self.path)
        found = self._settings or {}
        if self.weights is None and isinstance(found.get("weights"), dict):
            self.weights = {
                component_name(k): float(v) for k, v in found["weights"].items() if is_number(v)
            }
        if (
            self.group_size is None
            and isinstance(found.get("group_size"), int)
            and found["group_size"] > 0
        ):
            self.group_size = found["group_size"]

        if self.weights:
            source = "given (--weights)" if self.settings_file is None else str(self.settings_file)
            self.weights_note = f"TRL's reward_weights, from {source}"
        else:
            self.weights_note = (
                "unknown: TRL's completions parquet has neither its reward_weights nor its "
                "aggregate reward; the stored aggregate assumes the run's weights (1 each), TRL's "
                "advantages are its own. Give --weights name=w,... (GRPOConfig.reward_weights)"
            )

    def settings(self) -> dict[str, Any] | None:
        """The recorder's settings file, with what the user gave winning over it."""
        own = super().settings() or {}
        merged = {**(self._settings or {}), **own}
        return merged or None

    def files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        folder = self.path / "completions" if (self.path / "completions").is_dir() else self.path
        found = sorted(folder.glob("completions_*.parquet"), key=_file_step)
        if not found:
            raise ReaderError(
                f"{self.path}: no completions_<step>.parquet files "
                "(GRPOConfig(log_completions=True) writes them under <output_dir>/completions/)"
            )
        return found

    def component_columns(self, schema: pa.Schema) -> list[str]:
        named = self.components if self.components is not None else list(self.weights or {}) or None
        if named is not None:  # the reward functions are known: nothing else is a component
            return [c for c in schema.names if c not in KNOWN and component_name(c) in set(named)]
        return [
            f.name
            for f in schema
            if f.name not in KNOWN and _is_numeric(f.type) and not f.name.startswith(RECORDER_EXTRA)
        ]

    def sample_components(self, limit: int = 200) -> list[str]:
        names: dict[str, None] = {}
        for path in self.files()[:limit]:
            names.update(
                dict.fromkeys(
                    component_name(c) for c in self.component_columns(pq.read_schema(path))
                )
            )
        return list(names)

    def read(self, progress: Progress | None = None) -> Iterator[Item]:
        previous: str | None = None
        self._seen: dict[
            tuple[int, str], int
        ] = {}  # groups so far per (step, prompt): keys "#n" repeats
        self.duplicates = []
        for path in self.files():
            digest = _content_digest(path)
            if digest == previous:
                self.duplicates.append(path.name)
                if progress is not None:
                    progress(path.stat().st_size)
                continue
            previous = digest
            yield from self._read_file(path, progress)

    def _read_file(self, path: Path, progress: Progress | None) -> Iterator[Item]:
        name = str(path)
        pf = pq.ParquetFile(path)
        missing = [c for c in ("prompt", "completion") if c not in pf.schema_arrow.names]
        if missing:
            yield BadRecord(
                name,
                None,
                f"not a TRL completions file: no {', '.join(missing)} column",
                records=pf.metadata.num_rows,
            )
            return
        group_size = self.group_size or _runs_gcd(pf)
        comps = self.component_columns(pf.schema_arrow)
        extras = [c for c in pf.schema_arrow.names if c not in KNOWN and c not in comps]
        size, total = path.stat().st_size, max(pf.metadata.num_rows, 1)
        default_step = _file_step(path)
        run: list[tuple[int, dict[str, Any]]] = []  # rows of the group being assembled
        run_key: tuple[int, str] | None = None
        poisoned = False  # the run contains a bad row: drop it whole
        row_no = 0
        for batch in pf.iter_batches(batch_size=ROWS_PER_BATCH):
            for rec in batch.to_pylist():
                row_no += 1  # 1-based data row, as a spreadsheet of the file would number it
                try:
                    step = int_field(rec, "step") if rec.get("step") is not None else default_step
                    prompt = prompt_value(rec.get("prompt"), "prompt")
                    key = (step, stable_hash(prompt))
                except RecordError as e:
                    # The row's group is unknown: it may belong to the run being assembled, so that
                    # run is dropped too rather than stored without it.
                    yield BadRecord(name, row_no, str(e))
                    yield from self._drop(name, run, row_no)
                    run, run_key, poisoned = [], None, False
                    continue
                if key != run_key:
                    yield from self._flush(name, run, run_key, poisoned, group_size)
                    run, run_key, poisoned = [], key, False
                try:
                    rollout = self._rollout(rec, comps, extras)
                except RecordError as e:
                    yield BadRecord(name, row_no, str(e))
                    poisoned = True
                    continue
                run.append((row_no, {"prompt": prompt, "rollout": rollout}))
            if progress is not None:
                progress(int(size * batch.num_rows / total))
        yield from self._flush(name, run, run_key, poisoned, group_size)

    def _drop(
        self, name: str, run: list[tuple[int, dict[str, Any]]], bad_row: int
    ) -> Iterator[Item]:
        if run:
            yield BadRecord(
                name,
                run[0][0],
                f"dropped with the bad row {bad_row} (it may belong to this group)",
                records=len(run),
            )

    def _flush(
        self,
        name: str,
        run: list[tuple[int, dict[str, Any]]],
        run_key: tuple[int, str] | None,
        poisoned: bool,
        size: int | None,
    ) -> Iterator[Item]:
        if not run or run_key is None:
            return
        if poisoned:
            yield BadRecord(
                name, run[0][0], "dropped with a bad row of the same group", records=len(run)
            )
            return
        try:
            chunks = chunk_group(run, size)
        except RecordError as e:
            yield BadRecord(name, run[0][0], f"step {run_key[0]}: {e}", records=len(run))
            return
        step, phash = run_key
        for chunk in chunks:
            # The n-th group of this prompt at this step: a prompt drawn twice gets two keys, and
            # the same file imported twice gets the same keys (idempotent).
            n = self._seen.get(run_key, 0)
            self._seen[run_key] = n + 1
            key = f"p-{phash}" if n == 0 else f"p-{phash}#{n}"
            rollouts = [{"index": i, **row["rollout"]} for i, (_, row) in enumerate(chunk)]
            if not self.weights:
                self.flag("assumed_weights_rows", len(rollouts))
            try:
                record = group_record(step, key, chunk[0][1]["prompt"], rollouts)
            except RecordError as e:
                yield BadRecord(name, chunk[0][0], f"step {step}: {e}", records=len(chunk))
                continue
            yield GroupItem(self.clean(record), name, chunk[0][0], [r for r, _ in chunk])

    def _rollout(self, rec: dict[str, Any], comps: list[str], extras: list[str]) -> dict[str, Any]:
        if rec.get("completion") is None:
            raise RecordError("completion: is required")
        rollout = completion_fields(rec["completion"], "completion")
        rewards = {}
        for c in comps:
            v = rec.get(c)
            if v is not None and not isinstance(v, (int, float)):
                raise RecordError(f"{c}: must be a number, got {type(v).__name__}")
            rewards[component_name(c)] = finite_or_none(v)
        rollout["rewards"] = rewards
        if self.weights:
            rollout["reward"] = weighted_reward(rewards, self.weights)
        adv = rec.get("advantage")
        if adv is not None:
            if not is_number(adv):
                raise RecordError(f"advantage: must be a number, got {type(adv).__name__}")
            rollout["advantage"] = finite_or_none(adv)
        extra = {c: rec.get(c) for c in extras if rec.get(c) is not None}
        if extra:
            rollout["state"] = {
                "extra": json.loads(json.dumps(extra, default=str))
            }  # JSON-safe (dates, bytes)
        return rollout


def _find_settings(path: Path) -> tuple[Path | None, dict[str, Any] | None]:
    """The recorder's settings file in the output_dir: beside the parquet files or up to two folders
    above (output_dir/completions/completions_N.parquet). A file that is not a JSON object is named
    in the error."""
    start = path.parent if path.is_file() else path
    for folder in (start, start.parent, start.parent.parent):
        candidate = folder / SETTINGS_FILE
        if candidate.is_file():
            try:
                data = json.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ReaderError(f"{candidate}: not a JSON settings file ({e})") from None
            if not isinstance(data, dict):
                raise ReaderError(f"{candidate}: must be a JSON object of reward settings")
            return candidate, data
    return None, None


def _runs_gcd(pf: pq.ParquetFile) -> int | None:
    """G as the file shows it: the greatest common divisor of the lengths of its runs of
    consecutive rows with the same step and prompt (each is k x G in TRL's layout)."""
    cols = [c for c in ("step", "prompt") if c in pf.schema_arrow.names]
    size, last, n = 0, None, 0
    for batch in pf.iter_batches(batch_size=ROWS_PER_BATCH, columns=cols):
        for rec in batch.to_pylist():
            key = json.dumps(rec, sort_keys=True, default=str)
            if key != last and n:
                size, n = math.gcd(size, n), 0
            last, n = key, n + 1
    size = math.gcd(size, n)
    return size or None


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _file_step(path: Path) -> int:
    m = _STEP_IN_NAME.search(path.name)
    return int(m.group(1)) if m else 0


def _content_digest(path: Path) -> str:
    """Hash of a file's prompt and completion columns, read a batch at a time."""
    h = hashlib.sha1()
    pf = pq.ParquetFile(path)
    cols = [c for c in ("prompt", "completion") if c in pf.schema_arrow.names]
    if not cols:
        return f"no-columns:{path}"
    for batch in pf.iter_batches(batch_size=ROWS_PER_BATCH, columns=cols):
        for rec in batch.to_pylist():
            h.update(json.dumps(rec, sort_keys=True, default=str).encode())
    return h.hexdigest()
