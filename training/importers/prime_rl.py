"""PRIME-RL rollouts: the episode files its orchestrator's FileMonitor writes.

Where (prime_rl/monitors/file.py, `log_episodes`):
`<output_dir>/rollouts/step_N/<kind>/<subset>/traces.jsonl`, kind `train` or `eval`, subset `all`
(every completed episode, failures included, appended as they finish) or `effective` (the admitted
trainable episodes, per finalized batch). Give the run's output folder, its `rollouts/` folder or
one file; folders are searched recursively. Where a step's kind has both subsets, `effective` is
read (what the trainer trained on) and `all` is skipped and reported.

What (one verifiers `Episode.to_record()` per line, verifiers/v1/episode.py and trace.py; `None`
fields are left out): `{"id", "env": {"id", "name"}, "task": {"type", "data", "key", "hash"},
"group": {"id"}, "run": {"type", "id", "name", "work": {"type", "step", "policy"}}, "ok", "errors",
"traces": [...]}`, each trace `{"id", "task", "agent": {"name", "trainable", ...}, "nodes":
[{"parent", "message": {"role", "content", "tool_calls"...}, "sampled", "token_ids", "mask",
"advantages"...}], "rewards": {name: {"score", "weight"} | null}, "metrics": {name: float | null},
"info", "ok", "stop_condition", "errors", ...}`.

How it becomes groups: a group is the episodes with the same `group.id` at the same step (the step
from `run.work.step`, else the `step_N` folder); eval work is the holdout split. Each episode is one
rollout, from its first trainable trace: the transcript is the last branch of its message graph from
the first sampled message on (the messages before it are the prompt); each reward is a component
(value = score; the weights go to the run's settings, as every record states them) and the aggregate
is the trace's reward, the sum of score x weight; metrics, the agent, the stop condition and errors
go into the state. Advantages: the mean of the sampled tokens' non-zero advantages when the record
carries them, else PRIME-RL's GRPO credit, reward minus the group mean (no std scaling).

Records without "traces" are read in the flat format of earlier versions of this reader
(`{"step", "problem_id" | "example_id", "prompt", "completion", "reward", "advantage"?, "rewards" |
"task_rewards"?}`), which no PRIME-RL release is known to write.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.importers.base import (
    GroupingJsonlReader,
    Item,
    Progress,
    ReaderError,
    RecordError,
    RolloutRow,
    completion_fields,
    component_name,
    fill_advantages,
    group_key,
    int_field,
    is_number,
    jsonl_lines,
    messages,
    number_field,
    parse_json_object,
    prompt_value,
    split_numbers,
    stable_hash,
)

LEGACY_KNOWN = (
    "step",
    "problem_id",
    "example_id",
    "prompt",
    "completion",
    "reward",
    "advantage",
    "rewards",
    "task_rewards",
)
_STEP_DIR = re.compile(r"^step_(\d+)$")
SUBSETS = ("effective", "all")  # preferred first


@dataclass
class PrimeRLReader(GroupingJsonlReader):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.format = "prime-rl"
        self.grouping = "grouped by the episode's group.id within step (PRIME-RL traces.jsonl)"
        self.advantage = (
            "the record's token advantages when present, else PRIME-RL's GRPO credit: reward minus "
            "the group mean"
        )
        self.duplicates: list[str] = []
        self._weights: dict[str, float] = {}
        self._scale = (
            True  # legacy records: TRL's scaled advantage; episodes: PRIME-RL's unscaled credit
        )

    def files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        found = sorted(self.path.rglob("traces.jsonl"), key=_path_key)
        if not found:
            return super().files()  # a folder of flat *.jsonl records
        chosen: dict[Path, Path] = {}
        self.duplicates = []
        for f in found:  # .../step_N/<kind>/<subset>/traces.jsonl: one subset per step and kind
            kind_dir = f.parent.parent if f.parent.name in SUBSETS else f.parent
            have = chosen.get(kind_dir)
            if have is None or SUBSETS.index(f.parent.name) < SUBSETS.index(have.parent.name):
                if have is not None:
                    self.duplicates.append(str(have))
                chosen[kind_dir] = f
            else:
                self.duplicates.append(str(f))
        return sorted(chosen.values(), key=_path_key)

    def settings(self) -> dict[str, Any] | None:
        """The reward weights every trace states, read from the first records, and PRIME-RL's GRPO
        credit (reward minus group mean: scale_rewards none)."""
        for path in self.files()[:20]:
            for n, (_, _, raw) in enumerate(jsonl_lines(path)):
                if n >= 200:
                    break
                with contextlib.suppress(RecordError):  # reported with its line on import
                    self._trace_weights(parse_json_object(raw))
        own = super().settings() or {}
        found = {"weights": dict(self._weights), "scale_rewards": "none"} if self._weights else {}
        return {**found, **own} or None

    def _trace_weights(self, obj: dict[str, Any]) -> None:
        trace = _first_trace(obj) if "traces" in obj else None
        rewards = trace.get("rewards") if isinstance(trace, dict) else None
        for name, r in (rewards or {}).items():
            if isinstance(r, dict) and is_number(r.get("weight")):
                self._weights.setdefault(component_name(name), float(r["weight"]))

    def _read_file(self, path: Path, progress: Progress | None) -> Iterator[Item]:
        self._default_step, self._split = _folder_facts(path)
        yield from super()._read_file(path, progress)

    def _fill(self, rollouts: list[dict[str, Any]]) -> None:
        fill_advantages(rollouts, scale=self._scale)

    def parse_row(self, obj: dict[str, Any]) -> RolloutRow:
        if "traces" not in obj:
            self._scale = True
            return self._legacy_row(obj)
        self._scale = False
        return self._episode_row(obj)

    # ---- verifiers Episode records

    def _episode_row(self, obj: dict[str, Any]) -> RolloutRow:
        run = obj.get("run") if isinstance(obj.get("run"), dict) else {}
        work = run.get("work") if isinstance(run.get("work"), dict) else {}
        step = int_field(work, "step") if "step" in work else getattr(self, "_default_step", 0)
        group = obj.get("group")
        if group is not None and not (
            isinstance(group, dict) and isinstance(group.get("id"), (str, int))
        ):
            raise RecordError("group.id: must be a string or integer")
        task = obj.get("task") if isinstance(obj.get("task"), dict) else {}
        gid = (
            group["id"]
            if group
            else task.get("key") or task.get("hash") or stable_hash(task.get("data"))
        )
        key = group_key("g-" if group else "t-", gid)
        self._known_group = (step, key)
        trace = _first_trace(obj)
        if trace is None:
            raise RecordError(
                f"traces: the episode has no trace to store (ok={obj.get('ok')!r}, errors: "
                f"{_error_text(obj.get('errors'))})"
            )
        prompt, transcript = _conversation(trace)
        rollout: dict[str, Any] = {"transcript": transcript}
        rewards, total = {}, None
        raw = trace.get("rewards") or {}
        if not isinstance(raw, dict):
            raise RecordError("traces[0].rewards: must be an object of name -> {score, weight}")
        for name, r in raw.items():
            value = None
            if r is not None:
                if not isinstance(r, dict) or not is_number(r.get("score")):
                    raise RecordError(f"traces[0].rewards.{name}.score: must be a number")
                value = number_field(r, "score")
                weight = r.get("weight", 1.0)
                if value is not None and is_number(weight):
                    total = (total or 0.0) + value * float(weight)
            rewards[component_name(name)] = value
        rollout["rewards"], rollout["reward"] = rewards, total
        advantage = _advantage(trace)
        if advantage is not None:
            rollout["advantage"] = advantage
        rollout["state"] = _episode_state(obj, trace)
        split = (
            "holdout"
            if work.get("type") == "eval" or run.get("type") == "eval"
            else getattr(self, "_split", "train")
        )
        return RolloutRow(step=step, key=key, prompt=prompt, rollout=rollout, split=split)

    # ---- the flat records of earlier versions

    def _legacy_row(self, obj: dict[str, Any]) -> RolloutRow:
        step = int_field(obj, "step", default=0)
        ex = obj.get("problem_id", obj.get("example_id"))
        if ex is None or isinstance(ex, (dict, list, bool)) or ex == "":
            raise RecordError("problem_id: is required (or example_id), a string or integer")
        key = group_key("ex-", ex)
        self._known_group = (step, key)
        prompt = prompt_value(obj.get("prompt"), "prompt")
        if "completion" not in obj:
            raise RecordError("completion: is required")
        rollout: dict[str, Any] = completion_fields(obj["completion"], "completion")
        if "reward" not in obj:
            raise RecordError("reward: is required (the aggregate reward, or null)")
        rollout["reward"] = number_field(obj, "reward", required=False)
        if obj.get("advantage") is not None:
            rollout["advantage"] = number_field(obj, "advantage")
        breakdown = obj.get("rewards", obj.get("task_rewards")) or {}
        if not isinstance(breakdown, dict):
            raise RecordError("rewards: must be an object of name -> number")
        rewards, rest = split_numbers(breakdown, self.components)
        rollout["rewards"] = rewards
        state = {k: v for k, v in obj.items() if k not in LEGACY_KNOWN}
        if rest:
            state["rewards_extra"] = rest
        if state:
            rollout["state"] = state
        return RolloutRow(step=step, key=key, prompt=prompt, rollout=rollout)


def _first_trace(obj: dict[str, Any]) -> dict[str, Any] | None:
    traces = obj.get("traces")
    if not isinstance(traces, list):
        raise RecordError("traces: must be a list of traces")
    dicts = [t for t in traces if isinstance(t, dict)]
    trainable = [t for t in dicts if (t.get("agent") or {}).get("trainable", True)]
    return (trainable or dicts or [None])[0]


def _conversation(trace: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(prompt, transcript) from the last branch of the trace's message graph."""
    nodes = trace.get("nodes")
    if not isinstance(nodes, list) or not nodes or not all(isinstance(n, dict) for n in nodes):
        raise RecordError("traces[0].nodes: must be a non-empty list of message nodes")
    parents = {n.get("parent") for n in nodes}
    leaf = max(i for i in range(len(nodes)) if i not in parents)
    path, seen = [], set()
    i: Any = leaf
    while i is not None:
        if not isinstance(i, int) or not 0 <= i < len(nodes) or i in seen:
            raise RecordError(f"traces[0].nodes[{leaf}]: parent chain is broken at {i!r}")
        seen.add(i)
        path.append(i)
        i = nodes[i].get("parent")
    path.reverse()
    msgs = messages([nodes[i].get("message") for i in path], "traces[0].nodes.message")
    first = next((k for k, i in enumerate(path) if nodes[i].get("sampled")), len(path))
    if first == 0:
        raise RecordError("traces[0].nodes: the first message is sampled; there is no prompt")
    return msgs[:first], msgs[first:] or msgs[-1:]


def _advantage(trace: dict[str, Any]) -> float | None:
    """PRIME-RL's scalar for a trace: the mean of its non-zero token advantages, 0 when
    all are zero."""
    values = [
        v
        for n in trace.get("nodes") or []
        if isinstance(n, dict)
        for v in n.get("advantages") or []
        if is_number(v)
    ]
    if not values:
        return None
    nonzero = [float(v) for v in values if v != 0]
    return sum(nonzero) / len(nonzero) if nonzero else 0.0


def _episode_state(obj: dict[str, Any], trace: dict[str, Any]) -> dict[str, Any]:
    agent = trace.get("agent") if isinstance(trace.get("agent"), dict) else {}
    state = {
        "episode_id": obj.get("id"),
        "env": obj.get("env"),
        "agent": agent.get("name"),
        "ok": trace.get("ok"),
        "stop_condition": trace.get("stop_condition"),
        "metrics": trace.get("metrics") or None,
        "errors": _error_text(trace.get("errors")) or None,
        "traces": len(obj.get("traces") or []) if len(obj.get("traces") or []) > 1 else None,
    }
    return {k: v for k, v in state.items() if v is not None}


def _error_text(errors: Any) -> str:
    if not isinstance(errors, list):
        return ""
    return "; ".join(f"{e.get('type')}: {e.get('message')}" for e in errors if isinstance(e, dict))[
        :2000
    ]


def _folder_facts(path: Path) -> tuple[int, str]:
    """(step, split) from .../step_N/<train|eval>/<subset>/traces.jsonl; (0, train) elsewhere."""
    step, split = 0, "train"
    for part in path.parts:
        m = _STEP_DIR.match(part)
        if m:
            step = int(m.group(1))
    if "eval" in path.parts[-3:]:
        split = "holdout"
    return step, split


def _path_key(p: Path) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p)))


__all__ = ["PrimeRLReader", "ReaderError"]
