"""verifiers v1 `Episode` records, as PRIME-RL's FileMonitor and `prime eval` / `vf-eval` write
them: one record to one rollout. Shared by the PRIME-RL and verifiers readers.

A record's traces become the transcript (the trainable agent's nodes), its task the group, its
rewards and metrics the components, its token ids, masks and log-probs the optional `tokens`
object. The record's layout and each field's mapping: docs/integrations.md, "Module notes".
"""

from __future__ import annotations

import math
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
    nodes, path, first = _branch(trace)
    msgs = messages([nodes[i].get("message") for i in path], "traces[0].nodes.message")
    return msgs[:first], msgs[first:] or msgs[-1:]


def _branch(trace: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int], int]:
    """(nodes, the last branch's node indexes root to leaf, the position in it of the first
    sampled node: where the transcript starts)."""
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
    first = next((k for k, i in enumerate(path) if nodes[i].get("sampled")), len(path))
    if first == 0:
        raise RecordError("traces[0].nodes: the first message is sampled; there is no prompt")
    return nodes, path, first


class TokenProblem(ValueError):
    """A trace's per-token arrays cannot be stored (the rollout is, without them)."""


# node field -> (tokens field, kind): per sampled token, spread onto the node's sampled positions
SPREAD = (
    ("logprobs", "sampler_logprobs", "logprob"),
    ("trainer_logprobs", "trainer_logprobs", "logprob"),
    ("reference_logprobs", "ref_logprobs", "logprob"),
    ("entropies", "entropy", "entropy"),
    ("advantages", "advantages", "number"),
)
MAX_ID = 2**31 - 1
MAX_TOKENS = 262_144  # the ingestion's default per-rollout limit (TOKENS_MAX_PER_ROLLOUT)
LOGPROB_TOL = 1e-3  # as the ingestion service: bf16 rounding above 0


def trace_tokens(trace: dict[str, Any]) -> dict[str, list] | None:
    """The rollout's `tokens` object from a trace's message nodes (module docstring), or None when
    the transcript's nodes carry no token ids. Raises TokenProblem naming the node and field."""
    nodes, path, first = _branch(trace)
    kept = [(t, i) for t, i in enumerate(path[first:] or path[-1:]) if nodes[i].get("token_ids")]
    ids: list[int] = []
    mask: list[int] = []
    turn: list[int] = []
    for t, i in kept:
        tid, m = nodes[i]["token_ids"], nodes[i].get("mask")
        if not isinstance(tid, list) or not all(_is_id(x) for x in tid):
            raise TokenProblem(f"nodes[{i}].token_ids: must be a list of ids in [0, 2^31)")
        if not isinstance(m, list) or len(m) != len(tid):
            got = len(m) if isinstance(m, list) else type(m).__name__
            raise TokenProblem(f"nodes[{i}].mask: {got} values for {len(tid)} token_ids")
        ids += tid
        mask += [1 if x else 0 for x in m]
        turn += [t] * len(tid)
    if not ids:
        return None
    if len(ids) > MAX_TOKENS:
        raise TokenProblem(f"{len(ids)} tokens; the ingestion's limit is {MAX_TOKENS} a rollout")
    out: dict[str, list] = {"ids": ids, "loss_mask": mask, "turn": turn}
    for src, dst, kind in SPREAD:
        values = _spread(nodes, [i for _, i in kept], src, kind)
        if values is not None:
            out[dst] = values
    return out


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_ID


def _spread(nodes: list[dict[str, Any]], kept: list[int], src: str, kind: str) -> list | None:
    """One per-sampled-token field widened to the token ids (0.0 at unsampled positions); None
    when no node has it, or a node with sampled tokens lacks it (the field is then unknown, not
    zero)."""
    if all(nodes[i].get(src) is None for i in kept):
        return None
    out: list[float] = []
    for i in kept:
        m, v = nodes[i]["mask"], nodes[i].get(src) or []
        sampled = sum(1 for x in m if x)
        if len(v) != sampled:
            if not v:
                return None
            raise TokenProblem(f"nodes[{i}].{src}: {len(v)} values for {sampled} sampled tokens")
        for k, x in enumerate(v):
            if not is_number(x) or not math.isfinite(x):
                raise TokenProblem(f"nodes[{i}].{src}[{k}]: {x!r} is not a finite number")
            if kind == "logprob" and x > LOGPROB_TOL or kind == "entropy" and x < -LOGPROB_TOL:
                raise TokenProblem(f"nodes[{i}].{src}[{k}]: {x!r} is out of range for a {kind}")
        it = iter(v)
        out += [float(next(it)) if x else 0.0 for x in m]
    return out


def attach_tokens(rollout: dict[str, Any], trace: dict[str, Any]) -> None:
    """Set the rollout's `tokens` from the trace, or record in its state why they are not stored
    (`tokens_not_stored`); a rollout whose nodes carry no token ids has neither."""
    rollout.pop("tokens", None)
    rollout["state"].pop("tokens_not_stored", None)
    try:
        tokens = trace_tokens(trace)
    except TokenProblem as e:
        rollout["state"]["tokens_not_stored"] = str(e)
        return
    if tokens is not None:
        rollout["tokens"] = tokens


TOKENS_DROPPED = "rollouts stored without tokens (malformed token arrays; see state)"
TOKENS_GAP = (
    "some traces' token arrays are malformed (lengths that disagree, non-finite values or "
    "log-probs above 0): those rollouts are stored without tokens; see counts and each "
    "rollout's state.tokens_not_stored"
)


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
    attach_tokens(rollout, trace)
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
