"""The reader protocol shared by every importer, and the helpers they have in common. A reader turns
another trainer's rollout dump into ingestion records (training/records.py) without holding a
whole file in memory, yielding in file order `GroupItem` (a complete group with the file and line
it came from), `MetricsItem`, `SettingsItem` (first) and `BadRecord` (a record that could not be
read; its whole group is dropped with it, never half a group). Each reader says how it inferred
the grouping (`grouping`). Plain Python, no Django. More: docs/integrations.md, "Module notes".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import stats
from ..records import GroupRecord, InvalidRecord, RolloutRecord
from ..sinks import storable

# Same set as webapp/rollouts/ingest.py ROLES (training/ cannot import it): checked here too so the
# error names the source line instead of a position in a batch.
ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "environment"})
MAX_KEY = 300  # ingest's limit on a group key
_COMPONENT_OK = re.compile(r"[^A-Za-z0-9_\-./]")

Progress = Callable[[int], None]  # called with a number of bytes just read


class ReaderError(ValueError):
    """The input as a whole cannot be read (no such file, no files of the format in a folder)."""


class RecordError(ValueError):
    """One record is bad. `message` names the field; the reader attaches the file and line."""


@dataclass
class GroupItem:
    record: dict[
        str, Any
    ]  # ingestion format: {"step", "key", "prompt", "split"?, "rollouts": [...]}
    file: str
    line: int  # 1-based line (JSONL) or row (parquet) of the group's first record
    rollout_lines: list[int] | None = (
        None  # line/row of each rollout, when each came from its own record
    )

    @property
    def records(self) -> int:
        """How many source records this group was built from (what skipping it skips)."""
        return len(self.rollout_lines) if self.rollout_lines else 1

    def where(self, rollout: int | None = None) -> str:
        if rollout is not None and self.rollout_lines and 0 <= rollout < len(self.rollout_lines):
            return f"{self.file}:{self.rollout_lines[rollout]}"
        return f"{self.file}:{self.line}"


@dataclass
class MetricsItem:
    record: dict[str, Any]  # {"step": int, "values": {name: float}}
    file: str
    line: int


@dataclass
class SettingsItem:
    """The reward settings the trainer trained with (the JSONL sink's "settings" header, or the
    settings a reader found beside the data): they become the run's reward settings before its
    groups are stored."""

    record: dict[str, Any]  # the run's reward_settings shape (webapp/runs/reward_settings.py)
    file: str
    line: int | None

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@dataclass
class BadRecord:
    file: str
    line: int | None
    message: str
    records: int = 1  # source records dropped with this report

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@dataclass
class SkippedGroup:
    """Rows left out on purpose, not an error (the import goes on under --on-error stop too): the
    grouping the trainer used cannot be known from the file (a prompt drawn twice in a step, with
    no group id, its rows reordered), so no advantage may be computed from them. Counted in the
    import summary by `reason`."""

    file: str
    line: int | None
    message: str
    records: int
    reason: str = "ungroupable"

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file


Item = GroupItem | MetricsItem | SettingsItem | BadRecord | SkippedGroup


@dataclass
class Reader(ABC):
    """Base of every format reader. `components`, when given, says which numeric fields are reward
    components; numeric fields outside it are kept in the rollout's `state` instead."""

    path: Path
    components: list[str] | None = None
    group_size: int | None = None  # when given, groups of another size are bad records
    weights: dict[str, float] | None = (
        None  # the trainer's reward weights by component, when the user gives them
    )
    scale_rewards: str | None = (
        None  # the trainer's advantage scaling (group / batch / none), when the user gives it
    )
    format: str = field(default="", init=False)
    grouping: str = field(
        default="", init=False
    )  # how the grouping was inferred, stored on the run
    advantage: str = field(default="", init=False)  # where the advantages come from
    # What the import could not take as it is, counted for the run's summary ("nul_cleaned": strings
    # whose NUL became U+FFFD, ...), and how the weights were found (stored on the run).
    flags: dict[str, int] = field(default_factory=dict, init=False)
    weights_note: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if not self.path.exists():
            raise ReaderError(f"{self.path}: no such file or directory")
        if self.group_size is not None and self.group_size < 1:
            raise ReaderError("group_size: must be a positive integer")
        if self.components is not None:
            self.components = [component_name(c) for c in self.components]
        if self.weights is not None:
            self.weights = {component_name(k): float(v) for k, v in self.weights.items()}
        if self.scale_rewards not in (None, *stats.SCALES):
            raise ReaderError(f"scale_rewards: must be one of {', '.join(stats.SCALES)}")

    def settings(self) -> dict[str, Any] | None:
        """The reward settings the trainer used, as far as the dump or the user says (the
        run's reward_settings shape); the import applies them before the first group.
        None: nothing known."""
        out: dict[str, Any] = {}
        if self.weights:
            out["weights"] = dict(self.weights)
        if self.group_size is not None:
            out["group_size"] = self.group_size
        if self.scale_rewards is not None:
            out["scale_rewards"] = self.scale_rewards
        return out or None

    @abstractmethod
    def files(self) -> list[Path]:
        """The files this reader will read, in order."""

    def total_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files())

    @abstractmethod
    def read(self, progress: Progress | None = None) -> Iterator[Item]:
        """Yield groups, metrics and bad records in file order, streaming."""

    @abstractmethod
    def sample_components(self, limit: int = 200) -> list[str]:
        """Component names found in the first `limit` records (the run's environment is created
        from these before the import starts; later names are added as they appear)."""

    def __iter__(self) -> Iterator[Item]:
        return self.read()

    def notes(self) -> dict[str, str]:
        out = {"format": self.format, "grouping": self.grouping, "advantage": self.advantage}
        if self.weights_note:
            out["weights"] = self.weights_note
        return out

    def flag(self, name: str, n: int = 1) -> None:
        if n:
            self.flags[name] = self.flags.get(name, 0) + n

    def clean(self, record: dict[str, Any]) -> dict[str, Any]:
        """`record` as the recorder's sinks store text (sinks.storable: a NUL or a lone surrogate
        becomes U+FFFD, which Postgres can hold), counting the strings that changed."""
        self.flag("nul_cleaned", count_unstorable(record))
        return storable(record)


# ------------------------------------------------------------------------------------------ helpers


def count_unstorable(obj: Any) -> int:
    """Strings (and keys) in `obj` that sinks.storable changes: a NUL or a lone surrogate."""
    if isinstance(obj, str):
        return int("\x00" in obj or (not obj.isascii() and storable(obj) != obj))
    if isinstance(obj, dict):
        return sum(count_unstorable(k) + count_unstorable(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return sum(count_unstorable(v) for v in obj)
    return 0


def component_name(raw: Any) -> str:
    """A component name the web app accepts (letters, digits, _ - . /), derived deterministically,
    so the same source key always maps to the same component."""
    name = _COMPONENT_OK.sub("_", str(raw).strip())[:200]
    return name or "_"


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(
        v, (bool, np.bool_)
    )


def finite_or_none(v: Any) -> float | None:
    """NaN and None both mean "not scored"; the ingestion format spells that null."""
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def number_field(obj: dict[str, Any], name: str, *, required: bool = True) -> float | None:
    v = obj.get(name)
    if v is None:
        if required:
            raise RecordError(f"{name}: is required (a number)")
        return None
    if not is_number(v):
        raise RecordError(f"{name}: must be a number, got {type(v).__name__}")
    return finite_or_none(v)


def int_field(obj: dict[str, Any], name: str, default: int | None = None) -> int:
    v = obj.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        if isinstance(v, float) and v.is_integer() and v >= 0:
            return int(v)  # pandas turns an int column with a gap into floats
        raise RecordError(f"{name}: must be a non-negative integer, got {v!r}")
    return int(v)


def stable_hash(obj: Any, n: int = 16) -> str:
    """Short content hash used in group keys: the same prompt always gives the same key, so a
    re-import of the same file is recognised by ingestion's (step, key) idempotency."""
    text = (
        obj
        if isinstance(obj, str)
        else json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str)
    )
    # surrogatepass: a hostile lone surrogate must still hash (the record is refused
    # later, by field).
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def group_key(prefix: str, raw: Any) -> str:
    key = f"{prefix}{raw}"
    if len(key) > MAX_KEY:
        key = f"{prefix}{stable_hash(str(raw), 40)}"
    return key


def messages(value: Any, name: str) -> list[dict[str, Any]]:
    """Normalise chat messages as trainers write them (parquet structs carry every field, absent
    ones as None; multimodal content is a list of parts) into what ingestion accepts."""
    if not isinstance(value, (list, tuple)) or not value:
        raise RecordError(f"{name}: must be a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise RecordError(f"{name}[{i}]: must be an object with role and content")
        role = m.get("role")
        if role not in ROLES:
            raise RecordError(
                f"{name}[{i}].role: must be one of {', '.join(sorted(ROLES))}, got {role!r}"
            )
        msg: dict[str, Any] = {
            "role": role,
            "content": _content_text(m.get("content"), f"{name}[{i}].content"),
        }
        for k, v in m.items():
            if k in ("role", "content") or v is None:
                continue
            if k == "tool_calls":
                if not isinstance(v, (list, tuple)):
                    raise RecordError(f"{name}[{i}].tool_calls: must be a list")
                v = list(v)
            elif k == "name" and not isinstance(v, str):
                raise RecordError(f"{name}[{i}].name: must be a string")
            msg[k] = v
        out.append(msg)
    return out


def _content_text(content: Any, name: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # [{"type": "text", "text": ...}, {"type": "image"}]
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    raise RecordError(f"{name}: must be a string, a list of parts or null")


def prompt_value(value: Any, name: str = "prompt") -> str | list[dict[str, Any]]:
    if isinstance(value, str):
        return value
    return messages(value, name)


def completion_fields(value: Any, name: str = "completion") -> dict[str, Any]:
    """A completion is text (-> "completion") or a list of messages (-> "transcript")."""
    if isinstance(value, str):
        return {"completion": value}
    return {"transcript": messages(value, name)}


def split_numbers(
    values: dict[str, Any], components: list[str] | None
) -> tuple[dict[str, float | None], dict]:
    """Split extra fields into reward components (numeric, and in `components` when that is given)
    and everything else (kept verbatim in the rollout's state)."""
    rewards: dict[str, float | None] = {}
    rest: dict[str, Any] = {}
    allowed = set(components) if components is not None else None
    for k, v in values.items():
        name = component_name(k)
        if (v is None or is_number(v)) and (allowed is None or name in allowed):
            if v is None and allowed is None:
                rest[k] = v  # a null of unknown type: not evidence of a reward component
                continue
            rewards[name] = finite_or_none(v)
        else:
            rest[k] = v
    return rewards, rest


def fill_advantages(
    rollouts: list[dict[str, Any]], *, eps: float = stats.EPS, scale: bool = True
) -> str:
    """Give every rollout an advantage when the source has none: the GRPO advantage of the aggregate
    reward inside the group, (r - mean) / (std + eps), through training/stats (TRL's formula; verl's
    with eps 1e-6, and no division when `scale` is False). Returns "given" or "computed". Raises
    RecordError when only some rollouts carry one."""
    given = sum(r.get("advantage") is not None for r in rollouts)
    if given == len(rollouts):
        return "given"
    if given:
        raise RecordError(
            f"advantage: given for {given} of the group's {len(rollouts)} rollouts; give all or "
            "none"
        )
    rewards = np.array(
        [np.nan if r.get("reward") is None else r["reward"] for r in rollouts], dtype=np.float64
    )
    result = stats.compute_advantages(
        rewards[:, None],
        [1.0],
        np.zeros(len(rollouts), dtype=np.int64),
        scale_rewards="group" if scale else "none",
        eps=eps,
    )
    for r, a in zip(rollouts, result.advantages.tolist(), strict=True):
        r["advantage"] = a
    return "computed"


def group_record(
    step: int,
    key: str,
    prompt: str | list[dict[str, Any]],
    rollouts: list[dict[str, Any]],
    split: str = "train",
) -> dict[str, Any]:
    """The group every reader yields: `rollouts` (ingestion rollout fields; "index" is their
    position when absent) built into a `training.records.GroupRecord`, returned in the ingestion
    format. Raises RecordError naming the bad field (`rollouts[2].rewards.acc: ...`)."""
    try:
        record = GroupRecord(
            step=step,
            key=key,
            prompt=prompt,
            split=None if split == "train" else split,
            rollouts=[_rollout(i, r) for i, r in enumerate(rollouts)],
        )
    except InvalidRecord as e:
        raise RecordError(str(e)) from None
    return record.to_json()


def _rollout(i: int, r: dict[str, Any]) -> RolloutRecord:
    try:
        return RolloutRecord.from_json(r if "index" in r else {"index": i, **r})
    except InvalidRecord as e:
        raise e.within(f"rollouts[{i}]") from None


def chunk_group(rows: list[Any], group_size: int | None) -> list[list[Any]]:
    """Split a run of rows that share a prompt into groups of `group_size` (a prompt drawn
    twice in a step); without a size, the run is one group. Raises RecordError when the sizes
    do not divide."""
    if group_size is None or len(rows) == group_size:
        return [rows]
    if len(rows) % group_size:
        raise RecordError(
            f"group has {len(rows)} rollouts, not a multiple of the group size {group_size}"
        )
    return [rows[i : i + group_size] for i in range(0, len(rows), group_size)]


def modal_size(sizes: Any) -> int | None:
    """The most common group size (the smallest on a tie): the trainer's G as the file shows it,
    when nobody gave it. A prompt drawn k times in a step shows as k x G."""
    counts: dict[int, int] = {}
    for n in sizes:
        counts[n] = counts.get(n, 0) + 1
    return max(counts, key=lambda n: (counts[n], -n)) if counts else None


def jsonl_lines(path: Path, progress: Progress | None = None) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, raw line) for each non-blank line, read in binary so offsets are
    exact and a bad UTF-8 sequence is one bad record, not a crash."""
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if progress is not None:
                progress(len(raw))
            start, offset = offset, offset + len(raw)
            if raw.strip():
                yield lineno, start, raw


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_nan_constant)
    except UnicodeDecodeError as e:
        raise RecordError(f"not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        # json's messages may end in "at" ("Unterminated string starting at"): one "at" only.
        msg = e.msg.removesuffix(" at")
        raise RecordError(f"malformed JSON: {msg} at column {e.colno}") from None
    except RecursionError:
        raise RecordError("malformed JSON: nested too deeply") from None
    except ValueError as e:  # an integer literal past Python's 4300-digit conversion limit
        raise RecordError(f"malformed JSON: {e}") from None
    if not isinstance(obj, dict):
        raise RecordError(f"must be a JSON object, got {type(obj).__name__}")
    return obj


def _nan_constant(name: str) -> float:
    # Python's json writes NaN for float('nan') (a reward function's None after torch): read it as
    # NaN, which every reader turns into null ("not scored").
    return float("nan")


def jsonl_files(path: Path, pattern: str = "*.jsonl") -> list[Path]:
    if path.is_file():
        return [path]
    found = sorted(path.glob(pattern), key=_natural_key)
    if not found:
        raise ReaderError(f"{path}: no {pattern} files in this folder")
    return found


def _natural_key(p: Path) -> tuple:
    # "2.jsonl" before "10.jsonl": step-numbered dumps sort by step.
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name))


# ----------------------------------------------------------------------------- one rollout per line


@dataclass
class RolloutRow:
    """One rollout read from one record, before its group is known to be complete."""

    step: int
    key: str  # the group key, before any "#n" suffix for a prompt drawn twice
    prompt: str | list[dict[str, Any]]
    rollout: dict[str, Any]  # ingestion rollout fields except "index"
    split: str = "train"
    exact: bool = False  # the key is the trainer's own group id (uid, group_id), not a prompt


@dataclass
class GroupingJsonlReader(Reader):
    """JSONL with one rollout per line whose group must be reconstructed from a shared field.

    Rows of a group need not be consecutive (verl reorders a batch to balance sequence lengths
    before dumping it), so each file is read twice: the first pass parses every line, checks it and
    records only its byte offset under its group; the second pass seeks to each group's lines and
    builds the group. Memory is a few integers per line, whatever the file size; a group is complete
    when its file has been read to the end.
    """

    pattern: str = field(default="*.jsonl", init=False)

    def files(self) -> list[Path]:
        return jsonl_files(self.path, self.pattern)

    @abstractmethod
    def parse_row(self, obj: dict[str, Any]) -> RolloutRow:
        """Read one record. Raise RecordError naming the field; set `self._known_group` first when
        the group is known, so a bad record drops its whole group."""

    def sample_components(self, limit: int = 200) -> list[str]:
        names: dict[str, None] = {}
        seen = 0
        for path in self.files():
            for _, _, raw in jsonl_lines(path):
                # A bad record is reported with its line number when the import reads it.
                with contextlib.suppress(RecordError):
                    names.update(
                        dict.fromkeys(
                            self.parse_row(parse_json_object(raw)).rollout.get("rewards", {})
                        )
                    )
                seen += 1
                if seen >= limit:
                    return list(names)
        return list(names)

    def read(self, progress: Progress | None = None) -> Iterator[Item]:
        for path in self.files():
            yield from self._read_file(path, progress)

    def _read_file(self, path: Path, progress: Progress | None) -> Iterator[Item]:
        name = str(path)
        index: dict[tuple[int, str], list[tuple[int, int]]] = {}  # (step, key) -> [(offset, line)]
        exact: set[tuple[int, str]] = set()  # groups named by the rows themselves (uid, group_id)
        poisoned: dict[tuple[int, str], int] = {}  # group -> first bad line
        unreadable: list[int] = []  # bad lines whose group is unknown (a truncated last line)
        for lineno, offset, raw in jsonl_lines(path, progress):
            self._known_group: tuple[int, str] | None = None
            try:
                row = self.parse_row(parse_json_object(raw))
            except RecordError as e:
                yield BadRecord(name, lineno, str(e))
                if self._known_group is not None:
                    poisoned.setdefault(self._known_group, lineno)
                else:
                    unreadable.append(lineno)
                continue
            index.setdefault((row.step, row.key), []).append((offset, lineno))
            if row.exact:
                exact.add((row.step, row.key))
        size = self.group_size or modal_size(
            len(e) for gk, e in index.items() if gk not in poisoned
        )
        with open(path, "rb") as f:
            for gk, entries in index.items():
                held = self._held_back(name, gk, entries, size, gk in exact, poisoned, unreadable)
                if held is not None:
                    yield held
                    continue
                rows: list[tuple[int, RolloutRow]] = []
                for offset, lineno in entries:
                    f.seek(offset)
                    rows.append((lineno, self.parse_row(parse_json_object(f.readline()))))
                yield from self._groups(name, gk, rows)

    def _held_back(
        self,
        name: str,
        gk: tuple[int, str],
        entries: list[tuple[int, int]],
        size: int | None,
        exact: bool,
        poisoned: dict[tuple[int, str], int],
        unreadable: list[int],
    ) -> BadRecord | SkippedGroup | None:
        """Why a group must not be stored as read, or None. A group is never split by row order
        and never stored short of rows an unreadable line may have held."""
        n, where = len(entries), f"step {gk[0]}, key {gk[1]!r}"
        if gk in poisoned:
            return BadRecord(
                name,
                entries[0][1],
                f"dropped with the bad record at line {poisoned[gk]} (same group: {where})",
                records=n,
            )
        if unreadable and size and n < size:
            return BadRecord(
                name,
                entries[0][1],
                f"{where}: dropped whole: {n} of {size} rollouts, and line {unreadable[0]} could "
                "not be read (it may have held the rest of this group)",
                records=n,
            )
        if not exact and size and n > size and n % size == 0:
            self.flag("ungroupable_rows", n)
            return SkippedGroup(
                name,
                entries[0][1],
                f"{where}: {n} rows share this prompt, {n // size} groups of {size} drawn in the "
                "same step whose rows cannot be told apart (the file has no group id and the "
                "trainer reorders rows): not imported, rather than advantages from a guessed split",
                records=n,
            )
        return None

    def _groups(
        self, name: str, gk: tuple[int, str], rows: list[tuple[int, RolloutRow]]
    ) -> Iterator[Item]:
        if self.group_size is not None and len(rows) != self.group_size:
            yield BadRecord(
                name,
                rows[0][0],
                f"step {gk[0]}, key {gk[1]!r}: group has {len(rows)} rollouts, not the group "
                f"size {self.group_size}",
                records=len(rows),
            )
            return
        rollouts = [{"index": i, **row.rollout} for i, (_, row) in enumerate(rows)]
        try:
            self._fill(rollouts)
            record = group_record(gk[0], gk[1], rows[0][1].prompt, rollouts, rows[0][1].split)
        except RecordError as e:
            yield BadRecord(
                name, rows[0][0], f"step {gk[0]}, key {gk[1]!r}: {e}", records=len(rows)
            )
            return
        yield GroupItem(self.clean(record), name, rows[0][0], [lineno for lineno, _ in rows])

    def _fill(self, rollouts: list[dict[str, Any]]) -> None:
        """Advantages for a group without them (the trainer's formula; TRL's unless a
        reader says otherwise)."""
        fill_advantages(rollouts)
