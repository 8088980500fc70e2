"""verifiers' own evaluation output, what `prime eval` / `vf-eval` write outside PRIME-RL: either
`results.jsonl` + `metadata.json` (one rollout per line) or v1 episode files (read by
importers/episodes.py). Give the run folder, a folder of runs, or one file; folders are searched
recursively. The rollouts of one example (or task) form a group; the reward is the aggregate,
each metric a component, with the rubric's weights recovered or flagged. The layouts in detail:
docs/integrations.md, "Module notes".
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .base import (
    GroupingJsonlReader,
    Item,
    Progress,
    ReaderError,
    RecordError,
    RolloutRow,
    fill_advantages,
    group_key,
    is_number,
    jsonl_lines,
    messages,
    parse_json_object,
    prompt_value,
    split_numbers,
)
from .episodes import (
    TOKENS_DROPPED,
    TOKENS_GAP,
    episode_rollout,
    first_trace,
    record_key,
    task_prompt,
    trace_weights,
)

LEGACY_KNOWN = frozenset(
    {
        "example_id",
        "prompt",
        "completion",
        "reward",
        "metrics",
        "is_truncated",
        "error_chain",
        "long_error_chain",
    }
)
STATE_KEYS = ("answer", "info", "error", "stop_condition", "is_completed", "token_usage", "timing")
WEIGHT_ROWS = 100_000  # rows read to recover the rubric's weights
EXACT = 1e-9


@dataclass
class VerifiersReader(GroupingJsonlReader):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.format = "verifiers"
        self.grouping = "results.jsonl: example_id; traces.jsonl: the task (key, else hash)"
        self.advantage = (
            "none in the files (an evaluation): reward minus the group mean, as verifiers' "
            "Rubric.score_group defines it"
        )
        self.gaps: list[str] = []
        self.counts: dict[str, int] = {}
        self._prefix = ""
        self._expected: int | None = None
        self._metric_names: set[str] = set()

    def files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        found = sorted(self.path.rglob("results.jsonl")) + sorted(self.path.rglob("traces.jsonl"))
        if not found:
            raise ReaderError(f"{self.path}: no results.jsonl or traces.jsonl in this folder")
        return found

    def notes(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(super().notes())
        if self.gaps:
            out["gaps"] = list(self.gaps)
        if self.counts:
            out["counts"] = dict(self.counts)
        return out

    def settings(self) -> dict[str, Any] | None:
        own = super().settings() or {}
        weights: dict[str, float] = {}
        sizes: set[int] = set()
        for path in self.files():
            size = _group_size(path)
            if size is not None:
                sizes.add(size)
            if path.name == "results.jsonl":
                found = self._recovered_weights(path)
                for k, v in (found or {}).items():
                    weights.setdefault(k, v)
            else:
                for n, (_, _, raw) in enumerate(jsonl_lines(path)):
                    if n >= 200:
                        break
                    with contextlib.suppress(RecordError):
                        trace_weights(first_trace(parse_json_object(raw)), weights)
        found_settings: dict[str, Any] = {"scale_rewards": "none"}
        if weights:
            found_settings["weights"] = weights
        if len(sizes) == 1:
            found_settings["group_size"] = sizes.pop()
        return {**found_settings, **own}

    def _recovered_weights(self, path: Path) -> dict[str, float] | None:
        """The rubric's weights, when the file's `reward` is an exact weighted sum of its metrics
        (a unique least-squares solution with zero residual); None (and a gap) otherwise."""
        names: dict[str, None] = {}
        rows: list[tuple[dict[str, Any], float]] = []
        for n, (_, _, raw) in enumerate(jsonl_lines(path)):
            if n >= WEIGHT_ROWS:
                break
            with contextlib.suppress(RecordError):
                obj = parse_json_object(raw)
                metrics = obj.get("metrics")
                if isinstance(metrics, dict) and is_number(obj.get("reward")):
                    names.update(dict.fromkeys(k for k, v in metrics.items() if is_number(v)))
                    rows.append((metrics, float(obj["reward"])))
        cols = list(names)
        if not rows or not cols:
            return None
        m = np.array([[float(r.get(c, np.nan)) for c in cols] for r, _ in rows])
        y = np.array([t for _, t in rows])
        ok = np.isfinite(m).all(axis=1) & np.isfinite(y)
        m, y = m[ok], y[ok]
        if len(y) and np.linalg.matrix_rank(m) == len(cols):
            w, *_ = np.linalg.lstsq(m, y, rcond=None)
            if np.max(np.abs(m @ w - y)) <= EXACT * max(1.0, float(np.max(np.abs(y)))):
                return {c: float(round(x, 9)) for c, x in zip(cols, w, strict=True)}
        self._gap(
            f"{path}: the rubric's weights are not in results.jsonl and the reward is not an "
            f"exact, unique weighted sum of the metrics ({', '.join(cols)}): the weights are "
            "unknown; the aggregate is the file's reward"
        )
        return None

    def sample_components(self, limit: int = 200) -> list[str]:
        names: dict[str, None] = {}
        seen = 0
        for path in self.files():
            for _, _, raw in jsonl_lines(path):
                with contextlib.suppress(RecordError):
                    names.update(dict.fromkeys(self._row(parse_json_object(raw)).rewards))
                seen += 1
                if seen >= limit:
                    return list(names)
        return list(names)

    def _read_file(self, path: Path, progress: Progress | None) -> Iterator[Item]:
        self._prefix = f"{path.parent.name}:"
        self._expected = _group_size(path)
        yield from super()._read_file(path, progress)

    def parse_row(self, obj: dict[str, Any]) -> RolloutRow:
        return self._row(obj)

    def _fill(self, rollouts: list[dict[str, Any]]) -> None:
        if self._expected is not None and len(rollouts) != self._expected:
            self._count("groups whose size is not the run's rollouts per example")
            self._gap(
                "some groups do not have the run's rollouts per example (an interrupted or "
                "resumed evaluation): stored as they are; see counts"
            )
        for r in rollouts:
            if (r.get("state") or {}).get("tokens_not_stored"):
                self._count(TOKENS_DROPPED)
                self._gap(TOKENS_GAP)
        fill_advantages(rollouts, scale=False)

    # ---- one record

    def _row(self, obj: dict[str, Any]) -> _Row:
        if "traces" in obj:
            return self._episode_row(obj)
        return self._results_row(obj)

    def _episode_row(self, obj: dict[str, Any]) -> _Row:
        key = group_key(self._prefix, record_key(obj))
        self._known_group = (0, key)
        prompt, rollout = episode_rollout(obj, first_trace(obj))
        return _Row(0, key, prompt if prompt is not None else task_prompt(obj), rollout, "holdout")

    def _results_row(self, obj: dict[str, Any]) -> _Row:
        ex = obj.get("example_id")
        if ex is None or isinstance(ex, (dict, list, bool)) or ex == "":
            raise RecordError("example_id: is required, an integer or string")
        key = group_key(f"{self._prefix}ex-", ex)
        self._known_group = (0, key)
        raw_prompt = obj.get("prompt")
        prompt = prompt_value(_tool_calls_parsed(raw_prompt) if raw_prompt else "", "prompt")
        rollout: dict[str, Any] = _completion(obj.get("completion"))
        reward = obj.get("reward")
        if reward is not None and not is_number(reward):
            raise RecordError(f"reward: must be a number, got {type(reward).__name__}")
        rollout["reward"] = None if reward is None else float(reward)
        metrics = obj.get("metrics") or {}
        if not isinstance(metrics, dict):
            raise RecordError("metrics: must be an object of name -> number")
        rewards, rest = split_numbers(metrics, self.components)
        rollout["rewards"] = rewards
        if isinstance(obj.get("is_truncated"), bool):
            rollout["truncated"] = obj["is_truncated"]
        state = {k: obj[k] for k in STATE_KEYS if obj.get(k) not in (None, {}, "")}
        extra = {
            k: v for k, v in obj.items() if k not in LEGACY_KNOWN and k not in metrics
        }  # state_columns: the metrics are flattened to top-level keys as well
        extra = {k: v for k, v in extra.items() if k not in STATE_KEYS and k != "tool_defs"}
        if rest:
            state["metrics_extra"] = rest
        if extra:
            state["columns"] = extra
        if state:
            rollout["state"] = state
        return _Row(0, key, prompt, rollout, "holdout")

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def _gap(self, text: str) -> None:
        if text not in self.gaps:
            self.gaps.append(text)


@dataclass
class _Row(RolloutRow):
    @property
    def rewards(self) -> dict[str, Any]:
        return self.rollout.get("rewards", {})


def _completion(value: Any) -> dict[str, Any]:
    if value is None:
        return {"completion": ""}
    if isinstance(value, str):
        return {"completion": value}
    return {"transcript": messages(_tool_calls_parsed(value), "completion")}


def _tool_calls_parsed(value: Any) -> Any:
    """Messages with their tool calls as objects: verifiers saves each as a JSON string."""
    if not isinstance(value, list):
        return value
    out = []
    for m in value:
        if isinstance(m, dict) and isinstance(m.get("tool_calls"), list):
            m = {**m, "tool_calls": [_json_or_text(tc) for tc in m["tool_calls"]]}
        out.append(m)
    return out


def _json_or_text(tc: Any) -> Any:
    if not isinstance(tc, str):
        return tc
    try:
        return json.loads(tc)
    except ValueError:
        return tc


def _group_size(path: Path) -> int | None:
    """rollouts_per_example (metadata.json beside results.jsonl) or num_rollouts
    (configs/*.json beside a v1 traces.jsonl)."""
    meta = path.parent / "metadata.json"
    candidates = [meta] if path.name == "results.jsonl" else []
    if (path.parent / "configs").is_dir():
        candidates += sorted((path.parent / "configs").glob("*.json"))
    for f in candidates:
        if not f.is_file():
            continue
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        for k in ("rollouts_per_example", "num_rollouts", "group_size"):
            if isinstance(data.get(k), int) and not isinstance(data.get(k), bool):
                return data[k]
    return None


__all__ = ["VerifiersReader"]
