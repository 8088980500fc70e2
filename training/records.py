"""A rollout record: one group of rollouts in the ingestion format, typed.

Every producer (the recorder, the demos, eval, importers, exporters, bench generators) builds a
`GroupRecord` of `RolloutRecord`s and hands `to_json()` to a sink or the API; `from_json` reads
one back. A record is checked when it is built and raises `InvalidRecord` naming the field
(`rollouts[2].rewards.correct`; `groups[3].` in front from `parse_batch`).

The check functions below are the contract: the ingestion service (webapp/rollouts/validation.py)
calls the same ones on the request's dicts, with an `add(path, message)` that collects every
problem instead of raising at the first. What only the server knows (the run's components, the
group size limit, storable text, the token arrays' values) stays there. docs/api.md has the format.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "environment"})
MAX_KEY = 300
# Steps, indexes and lengths are 32-bit integer columns: a larger one would be a 500, not a 400.
MAX_INT = 2**31 - 1
BATCH_FIELDS = ("groups",)
GROUP_FIELDS = ("step", "key", "prompt", "split", "rollouts")
ROLLOUT_FIELDS = (
    "index",
    "completion",
    "transcript",
    "rewards",
    "advantage",
    "reward",
    "length",
    "truncated",
    "finish_reason",
    "parse_error",
    "state",
    "tokens",
)
SPLITS = ("train", "holdout")

AddError = Callable[[str, str], None]  # (field path, message)


class InvalidRecord(ValueError):
    """A record field breaks the ingestion contract; `path` names it."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path, self.message = path, message

    def within(self, prefix: str) -> InvalidRecord:
        """The same error seen from the enclosing record (`rollouts[2]` + `rewards.x`)."""
        return InvalidRecord(at(prefix, self.path) if self.path else prefix, self.message)


def raise_first(path: str, message: str) -> None:
    """An `AddError` that stops at the first problem (records; the server collects them all)."""
    raise InvalidRecord(path, message)


def at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# ------------------------------------------------------------------------------ the field checks


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -MAX_INT <= v <= MAX_INT


def finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def unknown_fields(obj: dict[str, Any], allowed: tuple[str, ...], path: str, add: AddError) -> None:
    """A misspelt field would otherwise be dropped without a word (and its data with it)."""
    for key in obj:
        if key not in allowed:
            name = str(key)[:100] or '""'
            add(at(path, name), f"unknown field; expected {', '.join(allowed)}")


def check_messages(msgs: Any, path: str, add: AddError) -> bool:
    """Chat messages: role, content (string or null), tool_calls (a list), name (a string)."""
    if not isinstance(msgs, list) or not msgs:
        add(path, "must be a non-empty list of messages")
        return False
    ok = True
    for i, m in enumerate(msgs):
        p = f"{path}[{i}]"
        if not isinstance(m, dict):
            add(p, "must be an object with role and content")
            ok = False
            continue
        if m.get("role") not in ROLES:
            add(f"{p}.role", f"must be one of {', '.join(sorted(ROLES))}")
            ok = False
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            add(f"{p}.content", "must be a string or null")
            ok = False
        if "tool_calls" in m and not isinstance(m["tool_calls"], list):
            add(f"{p}.tool_calls", "must be a list")
            ok = False
        if "name" in m and not isinstance(m["name"], str):
            add(f"{p}.name", "must be a string")
            ok = False
    return ok


def last_assistant_text(transcript: list[dict[str, Any]]) -> str:
    for m in reversed(transcript):
        if m.get("role") == "assistant" and m.get("content"):
            return m["content"]
    return ""


def parse_rewards(
    raw: Any, path: str, add: AddError, components: set[str] | None = None
) -> dict[str, tuple[float, str]]:
    """component -> (value, reason); NaN for a component that could not score (TRL's None).
    `components`: the run's, when known (the server); a name outside them is an error."""
    if not isinstance(raw, dict):
        add(path, "must be an object mapping component name to a number or {value, reason}")
        return {}
    out: dict[str, tuple[float, str]] = {}
    for name, v in raw.items():
        p = f"{path}.{name}" if path else name
        if components is not None and name not in components:
            known = ", ".join(sorted(components))
            add(p, f"unknown component (this run's environment has: {known})")
            continue
        reason = ""
        if isinstance(v, dict):
            extra = set(v) - {"value", "reason"}
            if extra:
                add(p, f"unexpected keys {sorted(extra)}; expected value and reason")
                continue
            reason = v.get("reason") or ""
            if not isinstance(reason, str):
                add(f"{p}.reason", "must be a string")
                continue
            v = v.get("value")
            p = f"{p}.value"
        if v is None:
            out[name] = (math.nan, reason)
        elif finite_number(v):
            out[name] = (float(v), reason)
        else:
            got = ", got a string" if isinstance(v, str) else ""
            add(p, f"must be a finite number or null{got}")
    return out


def parse_text(r: dict[str, Any], path: str, add: AddError) -> tuple[list[dict[str, Any]], str]:
    """(transcript, completion): a completion is a one-message transcript; a transcript's completion
    is its last assistant text."""
    has_c, has_t = "completion" in r, "transcript" in r
    if has_c == has_t:
        add(path, "give exactly one of completion (string) or transcript (list of messages)")
    elif has_c:
        if isinstance(r["completion"], str):
            return [{"role": "assistant", "content": r["completion"]}], r["completion"]
        add(at(path, "completion"), "must be a string")
    elif check_messages(r["transcript"], at(path, "transcript"), add):
        return r["transcript"], last_assistant_text(r["transcript"])
    return [], ""


def parse_number(r: dict[str, Any], name: str, path: str, add: AddError) -> float | None:
    v = r.get(name)
    if v is not None and not finite_number(v):
        add(at(path, name), "must be a finite number or null")
    return float(v) if finite_number(v) else None


def parse_string(r: dict[str, Any], name: str, path: str, add: AddError) -> str:
    v = r.get(name) or ""
    if not isinstance(v, str):
        add(at(path, name), "must be a string")
        return ""
    return v


def check_index(index: Any, path: str, add: AddError) -> None:
    if not is_int(index) or index < 0:
        add(at(path, "index"), f"must be a non-negative integer (at most {MAX_INT})")


def check_length_truncated(r: dict[str, Any], path: str, add: AddError) -> tuple[Any, Any]:
    length = r.get("length")
    if length is not None and (not is_int(length) or length < 0):
        add(at(path, "length"), f"must be a non-negative integer (at most {MAX_INT})")
    truncated = r.get("truncated", False)
    if not isinstance(truncated, bool):
        add(at(path, "truncated"), "must be true or false")
    return length, truncated


def check_state(state: Any, path: str, add: AddError) -> None:
    if state is not None and not isinstance(state, dict):
        add(at(path, "state"), "must be an object")


def check_group_fields(
    g: dict[str, Any], gp: str, seen: set[tuple[int, str]], add: AddError
) -> None:
    """step, key (unique in the batch: `seen`), prompt and split."""
    step, key, prompt = g.get("step"), g.get("key"), g.get("prompt")
    if not is_int(step) or step < 0:
        add(at(gp, "step"), f"must be a non-negative integer (at most {MAX_INT})")
    if not isinstance(key, str) or not key or len(key) > MAX_KEY:
        add(at(gp, "key"), f"must be a non-empty string of at most {MAX_KEY} characters")
    elif is_int(step):
        if (step, key) in seen:
            add(at(gp, "key"), f"duplicate group (step {step}, key {key!r}) in this batch")
        seen.add((step, key))
    if isinstance(prompt, list):
        check_messages(prompt, at(gp, "prompt"), add)
    elif not isinstance(prompt, str):
        add(at(gp, "prompt"), "must be a string or a list of messages")
    if g.get("split", "train") not in SPLITS:
        add(at(gp, "split"), "must be train or holdout")


def check_rollout_list(rollouts: Any, gp: str, add: AddError) -> bool:
    if not isinstance(rollouts, list) or not rollouts:
        add(at(gp, "rollouts"), "must be a non-empty list")
        return False
    return True


def check_index_unique(index: int, indexes: set[int], rp: str, add: AddError) -> None:
    if index in indexes:
        add(at(rp, "index"), f"duplicate rollout index {index} in this group")
    indexes.add(index)


def check_advantages(given: int, n: int, gp: str, add: AddError) -> None:
    if 0 < given < n:
        add(at(gp, "rollouts"), "advantage: give it for every rollout of the group or for none")


def check_rollout(r: dict[str, Any], path: str, add: AddError) -> None:
    """Every check of one rollout that needs no run (records): what the server adds is the run's
    components and the token arrays' values."""
    if not isinstance(r, dict):
        add(path, "must be an object")
        return
    unknown_fields(r, ROLLOUT_FIELDS, path, add)
    check_index(r.get("index"), path, add)
    parse_text(r, path, add)
    parse_rewards(r.get("rewards", {}), at(path, "rewards"), add)
    parse_number(r, "advantage", path, add)
    parse_number(r, "reward", path, add)
    check_length_truncated(r, path, add)
    parse_string(r, "finish_reason", path, add)
    parse_string(r, "parse_error", path, add)
    check_state(r.get("state"), path, add)
    if r.get("tokens") is not None and not isinstance(r["tokens"], dict):
        add(at(path, "tokens"), "must be an object of token arrays")


# -------------------------------------------------------------------------------------- records


class _Absent:
    """`reward` not given: the server computes it with the run's weights (null: never scored)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclass(frozen=True, slots=True)
class Score:
    """A component's value with the reason it was given (`{"value", "reason"}` in JSON); a bare
    number in `RolloutRecord.rewards` is a value without one."""

    value: float | None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "reason": self.reason}

    @classmethod
    def of(cls, scored: Any) -> Score:
        """From an environment's score (`.value`, NaN when not applicable, and `.reason`)."""
        value = None if math.isnan(scored.value) else float(scored.value)
        return cls(value, scored.reason)


Reward = float | None | Score


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """One completion of a group. Exactly one of `completion` (text) or `transcript` (chat
    messages, with tool calls and results). Optional fields left None are not sent; `reward` left
    ABSENT is computed by the server from the run's weights, None says the trainer did not score it.
    """

    index: int
    rewards: Mapping[str, Reward]
    completion: str | None = None
    transcript: list[dict[str, Any]] | None = None
    advantage: float | None = None
    reward: Any = ABSENT  # float | None | ABSENT
    length: int | None = None
    truncated: bool | None = None
    finish_reason: str | None = None
    parse_error: str | None = None
    state: dict[str, Any] | None = None
    tokens: dict[str, Any] | None = None  # per-token arrays (docs/tokens.md), checked by the server

    def __post_init__(self) -> None:
        check_rollout(self.to_json(), "", raise_first)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.completion is not None:
            out["completion"] = self.completion
        if self.transcript is not None:
            out["transcript"] = self.transcript
        rewards = self.rewards
        if isinstance(rewards, Mapping):  # anything else is sent as it is, for the check to name
            rewards = {k: v.to_json() if isinstance(v, Score) else v for k, v in rewards.items()}
        out["rewards"] = rewards
        if self.advantage is not None:
            out["advantage"] = self.advantage
        if self.reward is not ABSENT:
            out["reward"] = self.reward
        for name in _OPTIONAL:
            v = getattr(self, name)
            if v is not None:
                out[name] = v
        return out

    @classmethod
    def from_json(cls, obj: Any) -> RolloutRecord:
        _an_object(obj, ROLLOUT_FIELDS)
        rewards = obj.get("rewards", {})
        if isinstance(rewards, dict):
            rewards = {k: _score(v) for k, v in rewards.items()}
        fields = {k: v for k, v in obj.items() if k not in ("index", "rewards")}
        return cls(index=obj.get("index"), rewards=rewards, **fields)  # type: ignore[arg-type]


_OPTIONAL = (
    "length",
    "truncated",
    "finish_reason",
    "parse_error",
    "state",
    "tokens",
)


def _an_object(obj: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(obj, dict):
        raise InvalidRecord("", "must be an object")
    unknown_fields(obj, allowed, "", raise_first)


def _score(v: Any) -> Any:
    if isinstance(v, dict) and set(v) <= {"value", "reason"}:
        reason = v.get("reason") or ""
        if isinstance(reason, str):
            return Score(v.get("value"), reason)
    return v  # a number, null, or something the check names


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """The rollouts of one prompt at one step. `split` None is not sent (the server's "train")."""

    step: int
    key: str
    prompt: str | list[dict[str, Any]]
    rollouts: Sequence[RolloutRecord]
    split: str | None = None

    def __post_init__(self) -> None:
        g = {"step": self.step, "key": self.key, "prompt": self.prompt}
        if self.split is not None:
            g["split"] = self.split
        check_group_fields(g, "", set(), raise_first)
        rollouts = self.rollouts
        check_rollout_list(
            list(rollouts) if isinstance(rollouts, tuple) else rollouts, "", raise_first
        )
        indexes: set[int] = set()
        for i, r in enumerate(self.rollouts):
            if not isinstance(r, RolloutRecord):
                raise InvalidRecord(f"rollouts[{i}]", "must be a RolloutRecord")
            check_index_unique(r.index, indexes, f"rollouts[{i}]", raise_first)
        given = sum(r.advantage is not None for r in self.rollouts)
        check_advantages(given, len(self.rollouts), "", raise_first)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "key": self.key, "prompt": self.prompt}
        if self.split is not None:
            out["split"] = self.split
        out["rollouts"] = [r.to_json() for r in self.rollouts]
        return out

    @classmethod
    def from_json(cls, obj: Any) -> GroupRecord:
        _an_object(obj, GROUP_FIELDS)
        raw = obj.get("rollouts")
        check_rollout_list(raw, "", raise_first)
        rollouts = []
        for i, r in enumerate(raw):
            try:
                rollouts.append(RolloutRecord.from_json(r))
            except InvalidRecord as e:
                raise e.within(f"rollouts[{i}]") from None
        fields = {k: v for k, v in obj.items() if k != "rollouts"}
        return cls(
            step=fields.get("step"),  # type: ignore[arg-type]  # checked on construction
            key=fields.get("key"),  # type: ignore[arg-type]
            prompt=fields.get("prompt"),  # type: ignore[arg-type]
            rollouts=tuple(rollouts),
            split=fields.get("split"),
        )


def parse_batch(body: Any) -> list[GroupRecord]:
    """A batch `{"groups": [...]}` as records; InvalidRecord names `groups[g]....` at the first
    problem (the server's validation reports them all)."""
    if not isinstance(body, dict) or not isinstance(body.get("groups"), list):
        raise InvalidRecord("groups", "must be a list of groups")
    unknown_fields(body, BATCH_FIELDS, "", raise_first)
    out, seen = [], set()
    for i, g in enumerate(body["groups"]):
        try:
            rec = GroupRecord.from_json(g)
            check_group_fields(g, "", seen, raise_first)
        except InvalidRecord as e:
            raise e.within(f"groups[{i}]") from None
        out.append(rec)
    return out


def to_json(groups: Sequence[GroupRecord | dict[str, Any]]) -> list[dict[str, Any]]:
    """Groups in the ingestion format, records or already-built dicts (what a sink accepts)."""
    return [g.to_json() if isinstance(g, GroupRecord) else g for g in groups]
