"""Parse and check a batch of groups before anything is written (the first step of ingestion).

`validate_batch` walks the whole batch once and raises one FieldError listing every problem it
found (up to MAX_ERRORS), each naming its field path (`groups[3].rollouts[2].rewards.format`), so
a client fixes a batch in one round trip. What it returns is typed and safe to store: every string
is storable by both databases, every number finite or None, and each rollout carries its preview
and search text. The field checks are training/records.py's (the one definition of a rollout
record), run on the request's dicts; this module adds what only the run knows (its components,
the group size limit, storable text, token arrays).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings
from django.db import connection

from training.records import (
    BATCH_FIELDS,
    GROUP_FIELDS,
    MAX_INT,
    ROLLOUT_FIELDS,
    check_advantages,
    check_group_fields,
    check_index,
    check_index_unique,
    check_length_truncated,
    check_rollout_list,
    check_state,
    parse_number,
    parse_rewards,
    parse_string,
    parse_text,
    unknown_fields,
)
from webapp.errors import MAX_ERRORS, FieldError
from webapp.rollouts import text
from webapp.tokens.codec import TokenArrays
from webapp.tokens.validation import parse_tokens

__all__ = ["MAX_INT", "GroupIn", "RolloutIn", "unstorable_text", "validate_batch"]


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
    summary: text.TextSummary | None = None  # preview columns (derive_text), None until derived
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


def _flatten_prompt(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', '')}: {m.get('content') or ''}" for m in prompt)


def _parse_rollout(
    r: Any, path: str, components: set[str], errs: _Errors, vocab: int | None = None
) -> RolloutIn | None:
    """The checks of training/records.py (the contract), plus what only the run knows: its
    components and its vocabulary."""
    add = errs.add
    if not isinstance(r, dict):
        add(path, "must be an object")
        return None
    n0 = len(errs.items)
    unknown_fields(r, ROLLOUT_FIELDS, path, add)
    index = r.get("index")
    check_index(index, path, add)
    transcript, completion = parse_text(r, path, add)
    rewards = parse_rewards(r.get("rewards", {}), f"{path}.rewards", add, components)
    advantage, reward = (parse_number(r, name, path, add) for name in ("advantage", "reward"))
    length, truncated = check_length_truncated(r, path, add)
    finish_reason, parse_error = (
        parse_string(r, name, path, add) for name in ("finish_reason", "parse_error")
    )
    state = r.get("state")
    check_state(state, path, add)
    tokens = None
    if r.get("tokens") is not None:
        tokens = parse_tokens(r["tokens"], f"{path}.tokens", len(transcript) or 1, vocab, add)
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


def validate_batch(body: Any, components: set[str], vocab: int | None = None) -> list[GroupIn]:
    """Parse and check a whole batch. Raises FieldError listing every problem (up to MAX_ERRORS).
    `vocab`: the run's vocabulary size, when known (token ids are checked against it)."""
    errs = _Errors()
    if not isinstance(body, dict) or not isinstance(body.get("groups"), list):
        raise FieldError("groups", "must be a list of groups")
    unknown_fields(body, BATCH_FIELDS, "", errs.add)
    groups: list[GroupIn] = []
    seen: set[tuple[int, str]] = set()  # (step, key) of the batch's groups so far
    for gi, g in enumerate(body["groups"]):
        group = _parse_group(g, f"groups[{gi}]", components, seen, errs, vocab)
        if group is not None:
            groups.append(group)
    if errs:
        raise FieldError.of(errs.items)
    for group in groups:
        group.prompt_text = _flatten_prompt(group.prompt)
    return groups


def derive_text(group: GroupIn, r: RolloutIn) -> RolloutIn:
    """A valid rollout's previews, search document and (Postgres) its words: a good part of
    ingestion's CPU, so the writer derives them row by row while the database stores the rows
    before (rows.py streams them into the COPY), and never for a group already stored. Once."""
    if r.summary is None:
        r.summary = text.summarize(r.transcript, group.prompt)
        r.search_text = text.search_document(
            group.prompt_text,
            group.prompt,
            r.transcript,
            [reason for _, reason in r.rewards.values()],
        )
        # the word index: Postgres (SQLite, the demo, scans)
        r.search_words = (
            text.search_words(r.search_text) if connection.vendor == "postgresql" else None
        )
    return r


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
    add = errs.add
    unknown_fields(g, GROUP_FIELDS, gp, add)
    check_group_fields(g, gp, seen, add)
    rollouts = g.get("rollouts")
    max_size = settings.INGEST_MAX_GROUP_SIZE
    if not check_rollout_list(rollouts, gp, add):
        return None
    if len(rollouts) > max_size:
        add(f"{gp}.rollouts", f"group has {len(rollouts)} rollouts; the limit is {max_size}")
        return None
    split = g.get("split", "train")
    group = GroupIn(
        step=g.get("step"), key=g.get("key"), prompt=g.get("prompt"), prompt_text="", split=split
    )
    indexes: set[int] = set()
    for ri, r in enumerate(rollouts):
        rp = f"{gp}.rollouts[{ri}]"
        parsed = _parse_rollout(r, rp, components, errs, vocab)
        if parsed is None:
            continue
        check_index_unique(parsed.index, indexes, rp, add)
        group.rollouts.append(parsed)
    given = sum(r.advantage is not None for r in group.rollouts)
    check_advantages(given, len(group.rollouts), gp, add)
    return group
