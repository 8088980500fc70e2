"""verifiers v1 `Episode` records, as PRIME-RL's FileMonitor and `prime eval` / `vf-eval` write
them: one record to one rollout. Shared by the PRIME-RL and verifiers readers.

A record is `Episode.to_record()` (verifiers/v1/episode.py; `model_dump(mode="json",
exclude_none=True)`, so `None` fields are absent): `{"id", "env": {"id", "name"}, "task": {"type",
"data", "key", "hash"}, "group": {"id"}, "run": {"type", "id", "name", "work": {"type", "step",
"policy": {"start", "end"}}}, "ok", "errors", "traces": [...]}`, each trace (verifiers/v1/trace.py)
`{"id", "task", "agent": {"name", "trainable", ...}, "nodes": [{"parent", "message", "sampled",
"token_ids", "mask", "logprobs", "advantages"?, "reference_logprobs"?, "loss_weights"?}],
"rewards": {name: {"score", "weight"} | null}, "metrics": {name: float | null}, "info", "ok",
"stop_condition", "errors", "calls", "timing", ...}`.

The rollout is the episode's first trainable trace: its transcript is the last branch of the
message graph from the first sampled message on (the messages before it are the prompt), each
reward a component (value = score), the aggregate the trace's `reward` (verifiers: the sum of score
x weight over the rewards that scored), metrics, the agent, the stop condition and errors in the
state. Per-token arrays (token_ids, mask, logprobs, advantages) are not stored here.
"""

from __future__ import annotations

from typing import Any

from .base import (
    RecordError,
    component_name,
    group_key,
    is_number,
    messages,
    number_field,
    stable_hash,
)


def record_key(obj: dict[str, Any]) -> str:
    """The group key of an episode: its `group.id` (PRIME-RL: a uuid per dispatched group), else
    its task key or content hash (an eval's rollouts of one task)."""
    group = obj.get("group")
    if group is not None and not (
        isinstance(group, dict) and isinstance(group.get("id"), (str, int))
    ):
        raise RecordError("group.id: must be a string or integer")
    if group:
        return group_key("g-", group["id"])
    task = obj.get("task") if isinstance(obj.get("task"), dict) else {}
    return group_key("t-", task.get("key") or task.get("hash") or stable_hash(task.get("data")))


def first_trace(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The episode's first trace of a trainable agent (else its first trace); None when it has
    none (an episode that failed before any trace, kept on purpose in PRIME-RL's `all` file)."""
    traces = obj.get("traces", [])
    if not isinstance(traces, list):
        raise RecordError("traces: must be a list of traces")
    dicts = [t for t in traces if isinstance(t, dict)]
    trainable = [t for t in dicts if (t.get("agent") or {}).get("trainable", True)]
    return (trainable or dicts or [None])[0]


def conversation(trace: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
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


def trace_rewards(trace: dict[str, Any]) -> tuple[dict[str, float | None], float | None]:
    """({component: score}, the trace's reward: sum of score x weight, None when nothing
    scored)."""
    raw = trace.get("rewards") or {}
    if not isinstance(raw, dict):
        raise RecordError("traces[0].rewards: must be an object of name -> {score, weight}")
    rewards: dict[str, float | None] = {}
    total = None
    for name, r in raw.items():
        value = None
        if r is not None:
            if not isinstance(r, dict) or not is_number(r.get("score")):
                raise RecordError(f"traces[0].rewards.{name}.score: must be a number")
            value = number_field(r, "score")
            weight = r.get("weight", 1.0)
            if not is_number(weight):
                raise RecordError(f"traces[0].rewards.{name}.weight: must be a number")
            if value is not None:
                total = (total or 0.0) + value * float(weight)
        rewards[component_name(name)] = value
    return rewards, total


def trace_weights(trace: dict[str, Any] | None, into: dict[str, float]) -> None:
    """The weight each reward of a trace states, added to `into` (first seen wins)."""
    rewards = trace.get("rewards") if isinstance(trace, dict) else None
    for name, r in (rewards if isinstance(rewards, dict) else {}).items():
        if isinstance(r, dict) and is_number(r.get("weight")):
            into.setdefault(component_name(name), float(r["weight"]))


def token_advantage(trace: dict[str, Any]) -> float | None:
    """PRIME-RL's scalar for a trace (`scalar_advantage` in prime_rl/orchestrator/algo/routing.py):
    the mean of its non-zero token advantages, 0 when all are zero, None when none was assigned."""
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


def has_sampled_tokens(trace: dict[str, Any]) -> bool:
    """PRIME-RL trains a trace only when some node's mask marks a sampled token."""
    return any(isinstance(n, dict) and any(n.get("mask") or []) for n in trace.get("nodes") or [])


def episode_state(obj: dict[str, Any], trace: dict[str, Any] | None) -> dict[str, Any]:
    trace = trace or {}
    agent = trace.get("agent") if isinstance(trace.get("agent"), dict) else {}
    n_traces = len(obj.get("traces") or [])
    state = {
        "episode_id": obj.get("id"),
        "env": obj.get("env"),
        "agent": agent.get("name"),
        "ok": trace.get("ok", obj.get("ok")),
        "stop_condition": trace.get("stop_condition"),
        "metrics": trace.get("metrics") or None,
        "errors": error_text(trace.get("errors")) or error_text(obj.get("errors")) or None,
        "traces": n_traces if n_traces > 1 else None,
    }
    return {k: v for k, v in state.items() if v is not None}


def error_text(errors: Any) -> str:
    if not isinstance(errors, list):
        return ""
    return "; ".join(f"{e.get('type')}: {e.get('message')}" for e in errors if isinstance(e, dict))[
        :2000
    ]


def episode_rollout(
    obj: dict[str, Any], trace: dict[str, Any] | None
) -> tuple[str | list[dict[str, Any]] | None, dict[str, Any]]:
    """(prompt or None, rollout fields) of one episode. An episode without a trace is a rollout
    with an empty completion and no reward (nothing was scored), its errors in the state."""
    if trace is None:
        return None, {
            "completion": "",
            "rewards": {},
            "reward": None,
            "state": {**episode_state(obj, None), "no_trace": True},
        }
    prompt, transcript = conversation(trace)
    rewards, total = trace_rewards(trace)
    rollout = {
        "transcript": transcript,
        "rewards": rewards,
        "reward": total,
        "state": episode_state(obj, trace),
    }
    return prompt, rollout


def task_prompt(obj: dict[str, Any]) -> str:
    """A prompt for a group none of whose episodes has a trace: the task data as text."""
    task = obj.get("task") if isinstance(obj.get("task"), dict) else {}
    data = task.get("data")
    if isinstance(data, dict):
        for k in ("prompt", "question", "instruction", "problem"):
            if isinstance(data.get(k), str) and data[k]:
                return data[k]
    return f"(task {task.get('key') or task.get('hash') or stable_hash(data)}: no trace)"
