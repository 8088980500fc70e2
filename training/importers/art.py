"""ART (OpenPipe) trajectory-group Parquet files:
`<art_path>/<project>/models/<model>/trajectories/ <split>/<step:04d>.parquet`; give the model
folder, its `trajectories/` folder or one file.

One row per trajectory (format versions 1 and 2); the rows of one `group_index` are a group, the
`val` split the holdout. The trajectory's `reward` is the aggregate, each numeric metric a
component (not known to be weighted parts of it: flagged); the advantage is ART's GRPO. What is
exact and what is flagged, column by column: docs/integrations.md, "Module notes".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import (
    BadRecord,
    GroupItem,
    Item,
    Progress,
    Reader,
    ReaderError,
    RecordError,
    component_name,
    group_record,
    is_number,
    messages,
)

EPS = 1e-6  # ART: advantage /= reward_std + 1e-6
_STEP = re.compile(r"^(\d+)$")
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")


@dataclass
class ARTReader(Reader):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.format = "art"
        self.grouping = "ART trajectory groups: group_index within one step file"
        self.advantage = (
            "ART's GRPO: (reward - group mean) / (population std + 1e-6) (scale_rewards=True, "
            "ART's default; --scale-rewards none for reward - mean)"
        )
        self.gaps: list[str] = [
            "ART's reward is set by the rollout function: the metrics stored as components are "
            "not known to be weighted parts of it (weights unknown; the aggregate is the file's "
            "reward)",
        ]
        if self.scale_rewards is None:
            self.gaps.append(
                "ART's scale_rewards is not in the files: advantages assume its default (True)"
            )
        if self.scale_rewards in (None, "group"):
            self.gaps.append(
                "ART divides by the population std of the group; this application's "
                "recomputations (ablations) divide by the sample std, so an unchanged ablation "
                "differs from the stored advantages by sqrt((n-1)/n)"
            )
        self.counts: dict[str, int] = {}

    def files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        found = sorted(self.path.rglob("*.parquet"), key=lambda p: (p.parent.name, _step(p)))
        if not found:
            raise ReaderError(f"{self.path}: no ART trajectory .parquet files in this folder")
        return found

    def notes(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(super().notes())
        out["gaps"] = list(self.gaps)
        if self.counts:
            out["counts"] = dict(self.counts)
        return out

    def settings(self) -> dict[str, Any] | None:
        own = super().settings() or {}
        return {"scale_rewards": "group", "advantage_epsilon": EPS, **own}

    def sample_components(self, limit: int = 200) -> list[str]:
        names: dict[str, None] = {}
        for path in self.files()[:5]:
            for row in _rows(path)[:limit]:
                names.update(dict.fromkeys(_metric_components(_json_obj(row.get("metrics")))))
        return list(names)

    def read(self, progress: Progress | None = None) -> Iterator[Item]:
        for path in self.files():
            if progress is not None:
                progress(path.stat().st_size)
            yield from self._read_file(path)

    def _read_file(self, path: Path) -> Iterator[Item]:
        try:
            rows = _rows(path)
        except (OSError, ValueError) as e:
            yield BadRecord(str(path), None, f"not a readable Parquet file ({e})")
            return
        art_split = path.parent.name if path.parent.name in ("val", "eval", "test") else "train"
        step = _step(path)
        groups: dict[int, list[tuple[int, dict[str, Any]]]] = {}
        for i, row in enumerate(rows, start=1):
            gi = row.get("group_index")
            if not isinstance(gi, int) or isinstance(gi, bool):
                yield BadRecord(str(path), i, "group_index: must be an integer")
                continue
            groups.setdefault(gi, []).append((i, row))
        for gi, members in groups.items():
            trajs = [(i, r) for i, r in members if not _sentinel(r)]
            if not trajs:
                self.counts["groups without trajectories (every rollout raised)"] = (
                    self.counts.get("groups without trajectories (every rollout raised)", 0) + 1
                )
                continue
            trajs.sort(key=lambda m: m[1].get("trajectory_index") or 0)
            try:
                record = self._group(gi, step, art_split, [r for _, r in trajs])
            except RecordError as e:
                yield BadRecord(
                    str(path),
                    trajs[0][0],
                    f"group {gi}: {e} (its {len(trajs)} trajectories are not stored)",
                    records=len(trajs),
                )
                continue
            yield GroupItem(record, str(path), trajs[0][0], [i for i, _ in trajs])

    def _group(self, gi: int, step: int, split: str, rows: list[dict[str, Any]]) -> dict:
        rollouts = []
        prompt: Any = None
        for n, row in enumerate(rows):
            msgs = _messages(row)
            first = next((k for k, m in enumerate(msgs) if m.pop("_trainable", False)), None)
            for m in msgs:
                m.pop("_trainable", None)
            if first is None:  # no sampled Choice: the prompt is up to the last user message
                users = [k for k, m in enumerate(msgs) if m["role"] == "user"]
                first = users[-1] + 1 if users and users[-1] + 1 < len(msgs) else len(msgs) - 1
            first = max(first, 1) if len(msgs) > 1 else 0
            if prompt is None:
                prompt = messages(msgs[:first], f"group {gi} prompt") if first else "(no prompt)"
            reward = row.get("reward")
            if reward is not None and not is_number(reward):
                raise RecordError(f"reward: must be a number, got {type(reward).__name__}")
            metrics = _json_obj(row.get("metrics"))
            state = {
                k: v
                for k, v in (
                    ("metadata", _json_obj(row.get("metadata")) or None),
                    ("logs", list(row["logs"]) if row.get("logs") else None),
                    ("metrics_extra", _non_scalar(metrics) or None),
                    ("group_metadata", _json_obj(row.get("group_metadata")) or None),
                    ("group_metrics", _json_obj(row.get("group_metrics")) or None),
                )
                if v is not None
            }
            rollout = {
                "index": n,
                "transcript": messages(msgs[first:], f"trajectory {n}.messages"),
                "rewards": _metric_components(metrics),
                "reward": None if reward is None or not math.isfinite(reward) else float(reward),
            }
            if state:
                rollout["state"] = state
            rollouts.append(rollout)
        self._advantages(rollouts)
        key = f"{split}-g{gi}"
        return group_record(step, key, prompt, rollouts, "train" if split == "train" else "holdout")

    def _advantages(self, rollouts: list[dict[str, Any]]) -> None:
        rewards = [r["reward"] for r in rollouts]
        if any(r is None for r in rewards):
            raise RecordError("reward: null; ART trains every trajectory on its reward")
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
        scale = self.scale_rewards in (None, "group")
        for r in rollouts:
            a = r["reward"] - mean
            r["advantage"] = a / (std + EPS) if scale else a
            if r["advantage"] == 0:
                self.counts["trajectories with advantage 0 (ART does not train them)"] = (
                    self.counts.get("trajectories with advantage 0 (ART does not train them)", 0)
                    + 1
                )


def _rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _step(path: Path) -> int:
    m = _STEP.match(path.stem)
    return int(m.group(1)) if m else 0


def _sentinel(row: dict[str, Any]) -> bool:
    if "format_version" in row:
        return row.get("trajectory_index") is None
    return row.get("reward") is None and row.get("messages") is None


def _json_obj(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, (str, bytes)) and value:
        try:
            out = json.loads(value)
        except ValueError:
            return {}
        return out if isinstance(out, dict) else {}
    return {}


def _metric_components(metrics: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k, v in metrics.items():
        if isinstance(v, bool):
            out[component_name(k)] = float(v)
        elif is_number(v):
            out[component_name(k)] = float(v) if math.isfinite(v) else None
    return out


def _non_scalar(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not (isinstance(v, bool) or is_number(v))}


def _messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The trajectory's messages, each with `_trainable` (a sampled Choice), from the
    materialized `messages` column or, when it is null (format 2), from `trajectory_json`."""
    raw = row.get("messages")
    if raw is not None:
        out = []
        for m in raw:
            msg = {"role": m.get("role"), "content": m.get("content")}
            if m.get("tool_calls"):
                msg["tool_calls"] = _tool_calls(m["tool_calls"])
            if m.get("tool_call_id"):
                msg["tool_call_id"] = m["tool_call_id"]
            msg["_trainable"] = bool(m.get("trainable"))
            out.append(msg)
        return out
    traj = _json_obj(row.get("trajectory_json"))
    items = traj.get("messages_and_choices")
    if not isinstance(items, list) or not items:
        raise RecordError(
            "messages: null and trajectory_json has no messages_and_choices (a trajectory "
            "recorded as exchanges only)"
        )
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise RecordError("trajectory_json.messages_and_choices: must be objects")
        choice = "finish_reason" in item and isinstance(item.get("message"), dict)
        src = item["message"] if choice else item
        m = {k: src[k] for k in MESSAGE_KEYS if src.get(k) is not None}
        m.setdefault("role", src.get("role"))
        m.setdefault("content", None)
        m["_trainable"] = choice
        out.append(m)
    return out


def _tool_calls(raw: Any) -> Any:
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return [raw]


__all__ = ["ARTReader"]
