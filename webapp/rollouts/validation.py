"""Parse and check a batch of groups before anything is written (the first step of ingestion).

`validate_batch` walks the whole batch once and raises one FieldError listing every problem it
found (up to MAX_ERRORS), each naming its field path (`groups[3].rollouts[2].rewards.format`), so
a client fixes a batch in one round trip. What it returns is typed and safe to store: every string
is storable by both databases, every number finite or None, and each rollout carries its preview
and search text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings
from django.db import connection

from webapp.errors import MAX_ERRORS, FieldError
from webapp.rollouts import text
from webapp.tokens.codec import TokenArrays
from webapp.tokens.validation import parse_tokens

ROLES = {"system", "user", "assistant", "tool", "developer", "environment"}
MAX_KEY = 300
# Steps, indexes and lengths are 32-bit integer columns: a larger one would be a 500, not a 400.
MAX_INT = 2**31 - 1


@dataclass
class RolloutIn:
    """One rollout as validated: numbers finite or None, strings storable."""

    index: int
    transcript: list[dict[str, Any]]
    completion: str
    rewards: dict[str, tuple[float, str]]  # component -> (value or NaN, reason)
    advantage: float | None
    reward: float | None
    length: int | None
    truncated: bool
    finish_reason: str
    parse_error: str
    state: Any
    summary: text.TextSummary | None = None  # preview columns, set once the batch is valid
    search_text: str = ""
    search_words: set[str] | None = None  # its distinct words (text.search_words); Postgres
    # "reward": null sent explicitly: the trainer did not score it, so it is never re-derived
    # from the components (an absent "reward" is computed with the run's weights)
    reward_missing: bool = False
    tokens: TokenArrays | None = None  # per-token arrays (webapp/tokens), checked


@dataclass
class GroupIn:
    """One group as validated, its rollouts in the order sent (the order they are stored in)."""

    step: int
    key: str
    prompt: Any
    prompt_text: str
    split: str
    rollouts: list[RolloutIn] = field(default_factory=list)


class _Errors:
    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, path: str, message: str) -> None:
        if len(self.items) < MAX_ERRORS:
            self.items.append({"field": path, "error": message})

    def __bool__(self) -> bool:
        return bool(self.items)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -MAX_INT <= v <= MAX_INT


def unstorable_text(value: Any, path: str) -> tuple[str, str] | None:
    """(field, error) for the first string (or key) in `value` that no database can store: a NUL
    character (Postgres text and jsonb refuse it) or a lone surrogate (not encodable as UTF-8).
    Iterative, so a deeply nested value cannot exhaust the stack."""
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            if _bad_text(v):
                return p or "body", "must not contain NUL characters or lone surrogates"
        elif isinstance(v, dict):
            for k, item in v.items():
                kp = f"{p}.{k}" if p else str(k)
                if _bad_text(k):
                    return p or "body", "keys must not contain NUL characters or lone surrogates"
                stack.append((item, kp))
        elif isinstance(v, list):
            stack.extend((item, f"{p}[{i}]") for i, item in enumerate(v))
    return None


def _storable_fast(value: Any) -> bool:
    """True when `value` certainly holds no NUL and no lone surrogate: one C-speed serialisation
    instead of a Python walk over every string (a fifth of ingestion time). False means "walk it to
    find where" (orjson refuses surrogates, non-string keys and integers past 64 bits; NUL
    serialises as \\u0000)."""
    try:
        return b"\\u0000" not in orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        return False


def _without_tokens(g: dict[str, Any]) -> dict[str, Any]:
    """The group with its rollouts' token arrays left out (shallow copies; `g` unchanged): the
    storable-text check would otherwise serialise every number of them."""
    rollouts = g.get("rollouts")
    if not isinstance(rollouts, list) or not any(
        isinstance(r, dict) and "tokens" in r for r in rollouts
    ):
        return g
    bare = [
        {k: v for k, v in r.items() if k != "tokens"} if isinstance(r, dict) else r
        for r in rollouts
    ]
    return {**g, "rollouts": bare}


def _bad_text(s: str) -> bool:
    if "\x00" in s:
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _flatten_prompt(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', '')}: {m.get('content') or ''}" for m in prompt)


def _check_messages(msgs: Any, path: str, errs: _Errors) -> bool:
    if not isinstance(msgs, list) or not msgs:
        errs.add(path, "must be a non-empty list of messages")
        return False
    ok = True
    for i, m in enumerate(msgs):
        p = f"{path}[{i}]"
        if not isinstance(m, dict):
            errs.add(p, "must be an object with role and content")
            ok = False
            continue
        if m.get("role") not in ROLES:
            errs.add(f"{p}.role", f"must be one of {', '.join(sorted(ROLES))}")
            ok = False
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            errs.add(f"{p}.content", "must be a string or null")
            ok = False
        if "tool_calls" in m and not isinstance(m["tool_calls"], list):
            errs.add(f"{p}.tool_calls", "must be a list")
            ok = False
        if "name" in m and not isinstance(m["name"], str):
            errs.add(f"{p}.name", "must be a string")
            ok = False
    return ok


def _last_assistant_text(transcript: list[dict[str, Any]]) -> str:
    for m in reversed(transcript):
        if m.get("role") == "assistant" and m.get("content"):
            return m["content"]
    return ""


def _parse_rewards(
    raw: Any, path: str, components: set[str], errs: _Errors
) -> dict[str, tuple[float, str]]:
    if not isinstance(raw, dict):
        errs.add(path, "must be an object mapping component name to a number or {value, reason}")
        return {}
    out: dict[str, tuple[float, str]] = {}
    for name, v in raw.items():
        p = f"{path}.{name}"
        if name not in components:
            errs.add(
                p,
                f"unknown component (this run's environment has: {', '.join(sorted(components))})",
            )
            continue
        reason = ""
        if isinstance(v, dict):
            extra = set(v) - {"value", "reason"}
            if extra:
                errs.add(p, f"unexpected keys {sorted(extra)}; expected value and reason")
                continue
            reason = v.get("reason") or ""
            if not isinstance(reason, str):
                errs.add(f"{p}.reason", "must be a string")
                continue
            v = v.get("value")
            p = f"{p}.value"
        if v is None:
            out[name] = (math.nan, reason)  # unscorable by this component: TRL's None
        elif _finite_number(v):
            out[name] = (float(v), reason)
        else:
            errs.add(
                p,
                "must be a finite number or null"
                + (", got a string" if isinstance(v, str) else ""),
            )
    return out


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


def _unknown_fields(
    obj: dict[str, Any], allowed: tuple[str, ...], path: str, errs: _Errors
) -> None:
    """A misspelt field would otherwise be dropped without a word (and its data with it)."""
    for key in obj:
        if key not in allowed:
            name = str(key)[:100] or '""'
            where = f"{path}.{name}" if path else name
            errs.add(where, f"unknown field; expected {', '.join(allowed)}")


def _parse_rollout(
    r: Any, path: str, components: set[str], errs: _Errors, vocab: int | None = None
) -> RolloutIn | None:
    if not isinstance(r, dict):
        errs.add(path, "must be an object")
        return None
    n0 = len(errs.items)
    _unknown_fields(r, ROLLOUT_FIELDS, path, errs)
    index = r.get("index")
    if not _is_int(index) or index < 0:
        errs.add(f"{path}.index", f"must be a non-negative integer (at most {MAX_INT})")
    transcript, completion = _parse_text(r, path, errs)
    rewards = _parse_rewards(r.get("rewards", {}), f"{path}.rewards", components, errs)
    advantage, reward = (_parse_number(r, name, path, errs) for name in ("advantage", "reward"))
    length = r.get("length")
    if length is not None and (not _is_int(length) or length < 0):
        errs.add(f"{path}.length", f"must be a non-negative integer (at most {MAX_INT})")
    truncated = r.get("truncated", False)
    if not isinstance(truncated, bool):
        errs.add(f"{path}.truncated", "must be true or false")
    finish_reason, parse_error = (
        _parse_string(r, name, path, errs) for name in ("finish_reason", "parse_error")
    )
    state = r.get("state")
    if state is not None and not isinstance(state, dict):
        errs.add(f"{path}.state", "must be an object")
    tokens = None
    if r.get("tokens") is not None:
        tokens = parse_tokens(r["tokens"], f"{path}.tokens", len(transcript) or 1, vocab, errs.add)
    if len(errs.items) > n0:
        return None
    if length is None:
        length = len(completion.split())  # whitespace tokens: a fallback when the trainer sent none
    return RolloutIn(
        index=index,
        transcript=transcript,
        completion=completion,
        rewards=rewards,
        advantage=advantage,
        reward=reward,
        length=length,
        truncated=truncated,
        finish_reason=finish_reason[:50],
        parse_error=parse_error,
        state=state,
        reward_missing="reward" in r and r["reward"] is None,
        tokens=tokens,
    )


def _parse_text(r: dict[str, Any], path: str, errs: _Errors) -> tuple[list[dict[str, Any]], str]:
    """(transcript, completion): a completion is a one-message transcript; a transcript's completion
    is its last assistant text."""
    has_c, has_t = "completion" in r, "transcript" in r
    if has_c == has_t:
        errs.add(path, "give exactly one of completion (string) or transcript (list of messages)")
    elif has_c:
        if isinstance(r["completion"], str):
            return [{"role": "assistant", "content": r["completion"]}], r["completion"]
        errs.add(f"{path}.completion", "must be a string")
    elif _check_messages(r["transcript"], f"{path}.transcript", errs):
        return r["transcript"], _last_assistant_text(r["transcript"])
    return [], ""


def _parse_number(r: dict[str, Any], name: str, path: str, errs: _Errors) -> float | None:
    v = r.get(name)
    if v is not None and not _finite_number(v):
        errs.add(f"{path}.{name}", "must be a finite number or null")
    return float(v) if _finite_number(v) else None


def _parse_string(r: dict[str, Any], name: str, path: str, errs: _Errors) -> str:
    v = r.get(name) or ""
    if not isinstance(v, str):
        errs.add(f"{path}.{name}", "must be a string")
        return ""
    return v


def validate_batch(body: Any, components: set[str], vocab: int | None = None) -> list[GroupIn]:
    """Parse and check a whole batch. Raises FieldError listing every problem (up to MAX_ERRORS).
    `vocab`: the run's vocabulary size, when known (token ids are checked against it)."""
    errs = _Errors()
    if not isinstance(body, dict) or not isinstance(body.get("groups"), list):
        raise FieldError("groups", "must be a list of groups")
    _unknown_fields(body, BATCH_FIELDS, "", errs)
    groups: list[GroupIn] = []
    seen: set[tuple[int, str]] = set()  # (step, key) of the batch's groups so far
    for gi, g in enumerate(body["groups"]):
        group = _parse_group(g, f"groups[{gi}]", components, seen, errs, vocab)
        if group is not None:
            groups.append(group)
    if errs:
        raise FieldError.of(errs.items)
    words = connection.vendor == "postgresql"  # the word index (SQLite, the demo, scans)
    for group in groups:  # only for a valid batch: the text work is a good part of ingestion
        group.prompt_text = _flatten_prompt(group.prompt)
        for r in group.rollouts:
            r.summary = text.summarize(r.transcript, group.prompt)
            r.search_text = text.search_document(
                group.prompt_text,
                group.prompt,
                r.transcript,
                [reason for _, reason in r.rewards.values()],
            )
            r.search_words = text.search_words(r.search_text) if words else None
    return groups


def _parse_group(
    g: Any,
    gp: str,
    components: set[str],
    seen: set[tuple[int, str]],
    errs: _Errors,
    vocab: int | None = None,
) -> GroupIn | None:
    if not isinstance(g, dict):
        errs.add(gp, "must be an object")
        return None
    plain = _without_tokens(g)  # token arrays are numbers (their text is checked with them)
    bad = None if _storable_fast(plain) else unstorable_text(plain, gp)
    if bad is not None:
        errs.add(*bad)
        return None
    _unknown_fields(g, GROUP_FIELDS, gp, errs)
    _check_group_fields(g, gp, seen, errs)
    rollouts = g.get("rollouts")
    max_size = settings.INGEST_MAX_GROUP_SIZE
    if not isinstance(rollouts, list) or not rollouts:
        errs.add(f"{gp}.rollouts", "must be a non-empty list")
        return None
    if len(rollouts) > max_size:
        errs.add(f"{gp}.rollouts", f"group has {len(rollouts)} rollouts; the limit is {max_size}")
        return None
    split = g.get("split", "train")
    group = GroupIn(
        step=g.get("step"), key=g.get("key"), prompt=g.get("prompt"), prompt_text="", split=split
    )
    indexes: set[int] = set()
    for ri, r in enumerate(rollouts):
        parsed = _parse_rollout(r, f"{gp}.rollouts[{ri}]", components, errs, vocab)
        if parsed is None:
            continue
        if parsed.index in indexes:
            errs.add(
                f"{gp}.rollouts[{ri}].index",
                f"duplicate rollout index {parsed.index} in this group",
            )
        indexes.add(parsed.index)
        group.rollouts.append(parsed)
    given = sum(r.advantage is not None for r in group.rollouts)
    if 0 < given < len(group.rollouts):
        errs.add(f"{gp}.rollouts", "advantage: give it for every rollout of the group or for none")
    return group


def _check_group_fields(
    g: dict[str, Any], gp: str, seen: set[tuple[int, str]], errs: _Errors
) -> None:
    step, key, prompt = g.get("step"), g.get("key"), g.get("prompt")
    if not _is_int(step) or step < 0:
        errs.add(f"{gp}.step", f"must be a non-negative integer (at most {MAX_INT})")
    if not isinstance(key, str) or not key or len(key) > MAX_KEY:
        errs.add(f"{gp}.key", f"must be a non-empty string of at most {MAX_KEY} characters")
    elif _is_int(step):
        if (step, key) in seen:
            errs.add(f"{gp}.key", f"duplicate group (step {step}, key {key!r}) in this batch")
        seen.add((step, key))
    if isinstance(prompt, list):
        _check_messages(prompt, f"{gp}.prompt", errs)
    elif not isinstance(prompt, str):
        errs.add(f"{gp}.prompt", "must be a string or a list of messages")
    if g.get("split", "train") not in ("train", "holdout"):
        errs.add(f"{gp}.split", "must be train or holdout")
