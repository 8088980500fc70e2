"""The one ingestion service: every path (API, importers, the recorder's database sink) calls `ingest_groups`.

A batch is validated whole before anything is written; then it is written in one transaction, so a
batch is stored completely or not at all. Idempotent on (run, step, group key): a group that is
already stored is skipped, so a retried batch stores nothing twice. Bulk rows go through Postgres
COPY (psycopg 3) with ids drawn from the sequences up front; SQLite uses bulk_create. Each group's
packed score matrix (Group.packed_scores, the run reader's fast path) is written in the same
transaction. Nothing changes rollouts or scores after ingestion (a run's deletion cascades to its
groups), so the blob never goes stale.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction

from training import stats
from webapp.errors import MAX_ERRORS, FieldError
from webapp.rollouts import packed, text
from webapp.rollouts.models import Group, GroupComponentStat, RewardComponent, RewardScore, Rollout
from webapp.runs.models import Run

ROLES = {"system", "user", "assistant", "tool", "developer", "environment"}
MAX_KEY = 300
MAX_INT = (
    2**31 - 1
)  # steps, indexes and lengths are 32-bit integer columns: larger ones would be a 500


@dataclass
class _Rollout:
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


@dataclass
class _Group:
    step: int
    key: str
    prompt: Any
    prompt_text: str
    split: str
    rollouts: list[_Rollout] = field(default_factory=list)


@dataclass(frozen=True)
class IngestResult:
    groups: int  # newly stored
    rollouts: int
    skipped_groups: int  # already stored (a retried batch)


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
    """True when `value` certainly holds no NUL and no lone surrogate: one C-speed serialisation instead of
    a Python walk over every string (a fifth of ingestion time). False means "walk it to find where"
    (orjson refuses surrogates, non-string keys and integers past 64 bits; NUL serialises as \\u0000)."""
    try:
        return b"\\u0000" not in orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        return False


def dumps(value: Any) -> str:
    """JSON text for a jsonb column: orjson (several times faster than json; NaN and infinities become
    null, which jsonb accepts, where json.dumps wrote NaN, which it refuses); json for what orjson cannot
    encode (integers past 64 bits, non-string keys are kept as their str)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(value, default=str)


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


def _parse_rollout(r: Any, path: str, components: set[str], errs: _Errors) -> _Rollout | None:
    if not isinstance(r, dict):
        errs.add(path, "must be an object")
        return None
    n0 = len(errs.items)
    _unknown_fields(r, ROLLOUT_FIELDS, path, errs)
    index = r.get("index")
    if not _is_int(index) or index < 0:
        errs.add(f"{path}.index", f"must be a non-negative integer (at most {MAX_INT})")
    has_c, has_t = "completion" in r, "transcript" in r
    transcript: list[dict[str, Any]] = []
    completion = ""
    if has_c == has_t:
        errs.add(path, "give exactly one of completion (string) or transcript (list of messages)")
    elif has_c:
        if not isinstance(r["completion"], str):
            errs.add(f"{path}.completion", "must be a string")
        else:
            completion = r["completion"]
            transcript = [{"role": "assistant", "content": completion}]
    elif _check_messages(r["transcript"], f"{path}.transcript", errs):
        transcript = r["transcript"]
        completion = _last_assistant_text(transcript)
    rewards = _parse_rewards(r.get("rewards", {}), f"{path}.rewards", components, errs)
    numbers: dict[str, float | None] = {}
    for name in ("advantage", "reward"):
        v = r.get(name)
        if v is not None and not _finite_number(v):
            errs.add(f"{path}.{name}", "must be a finite number or null")
        numbers[name] = float(v) if _finite_number(v) else None
    length = r.get("length")
    if length is not None and (not _is_int(length) or length < 0):
        errs.add(f"{path}.length", f"must be a non-negative integer (at most {MAX_INT})")
    truncated = r.get("truncated", False)
    if not isinstance(truncated, bool):
        errs.add(f"{path}.truncated", "must be true or false")
    strings = {}
    for name in ("finish_reason", "parse_error"):
        v = r.get(name) or ""
        if not isinstance(v, str):
            errs.add(f"{path}.{name}", "must be a string")
        strings[name] = v if isinstance(v, str) else ""
    state = r.get("state")
    if state is not None and not isinstance(state, dict):
        errs.add(f"{path}.state", "must be an object")
    if len(errs.items) > n0:
        return None
    if length is None:
        length = len(completion.split())  # whitespace tokens: a fallback when the trainer sent none
    return _Rollout(
        index=index,
        transcript=transcript,
        completion=completion,
        rewards=rewards,
        advantage=numbers["advantage"],
        reward=numbers["reward"],
        length=length,
        truncated=truncated,
        finish_reason=strings["finish_reason"][:50],
        parse_error=strings["parse_error"],
        state=state,
    )


def validate_batch(body: Any, components: set[str]) -> list[_Group]:
    """Parse and check a whole batch. Raises FieldError listing every problem (up to MAX_ERRORS)."""
    errs = _Errors()
    if not isinstance(body, dict) or not isinstance(body.get("groups"), list):
        raise FieldError("groups", "must be a list of groups")
    _unknown_fields(body, BATCH_FIELDS, "", errs)
    max_size = settings.INGEST_MAX_GROUP_SIZE
    groups: list[_Group] = []
    seen: set[tuple[int, str]] = set()
    for gi, g in enumerate(body["groups"]):
        gp = f"groups[{gi}]"
        if not isinstance(g, dict):
            errs.add(gp, "must be an object")
            continue
        bad = None if _storable_fast(g) else unstorable_text(g, gp)
        if bad is not None:
            errs.add(*bad)
            continue
        _unknown_fields(g, GROUP_FIELDS, gp, errs)
        step, key, prompt = g.get("step"), g.get("key"), g.get("prompt")
        if not _is_int(step) or step < 0:
            errs.add(f"{gp}.step", f"must be a non-negative integer (at most {MAX_INT})")
        if not isinstance(key, str) or not key or len(key) > MAX_KEY:
            errs.add(f"{gp}.key", f"must be a non-empty string of at most {MAX_KEY} characters")
        elif _is_int(step):
            if (step, key) in seen:
                errs.add(f"{gp}.key", f"duplicate group (step {step}, key {key!r}) in this batch")
            seen.add((step, key))
        if not isinstance(prompt, str):
            _check_messages(prompt, f"{gp}.prompt", errs) if isinstance(prompt, list) else errs.add(
                f"{gp}.prompt", "must be a string or a list of messages"
            )
        split = g.get("split", "train")
        if split not in ("train", "holdout"):
            errs.add(f"{gp}.split", "must be train or holdout")
        rollouts = g.get("rollouts")
        if not isinstance(rollouts, list) or not rollouts:
            errs.add(f"{gp}.rollouts", "must be a non-empty list")
            continue
        if len(rollouts) > max_size:
            errs.add(
                f"{gp}.rollouts", f"group has {len(rollouts)} rollouts; the limit is {max_size}"
            )
            continue
        group = _Group(step=step, key=key, prompt=prompt, prompt_text="", split=split)
        indexes: set[int] = set()
        for ri, r in enumerate(rollouts):
            parsed = _parse_rollout(r, f"{gp}.rollouts[{ri}]", components, errs)
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
            errs.add(
                f"{gp}.rollouts", "advantage: give it for every rollout of the group or for none"
            )
        groups.append(group)
    if errs:
        raise FieldError.of(errs.items)
    for group in groups:
        group.prompt_text = _flatten_prompt(group.prompt)
        for r in group.rollouts:
            r.summary = text.summarize(r.transcript, group.prompt)
            r.search_text = text.search_document(
                group.prompt_text,
                group.prompt,
                r.transcript,
                [reason for _, reason in r.rewards.values()],
            )
    return groups


def run_weights(run: Run, components: list[RewardComponent]) -> np.ndarray:
    """The run's weights in `components` order (Run.reward_weights: the trainer's, then the job config's,
    then the environment's defaults)."""
    weights = run.reward_weights(components)
    return np.array([weights[c.name] for c in components], dtype=np.float64)


def _compute(run: Run, groups: list[_Group], comps: list[RewardComponent]) -> dict[str, np.ndarray]:
    """Matrix of component values, aggregate rewards, advantages and group stats for the batch."""
    names = [c.name for c in comps]
    rows = [r for g in groups for r in g.rollouts]
    n, k = len(rows), len(names)
    matrix = np.full((n, k), np.nan)
    col = {name: j for j, name in enumerate(names)}
    for i, r in enumerate(rows):
        for name, (value, _) in r.rewards.items():
            matrix[i, col[name]] = value
    gid = np.repeat(np.arange(len(groups)), [len(g.rollouts) for g in groups])
    steps = np.repeat(
        np.array([g.step for g in groups], dtype=np.int64), [len(g.rollouts) for g in groups]
    )
    settings = run.advantage_settings()
    result = stats.compute_advantages(
        matrix,
        run_weights(run, comps),
        gid,
        scale_rewards=settings["scale_rewards"],
        aggregation=settings["aggregation"],
        batch_ids=steps,
        eps=settings["advantage_epsilon"],
    )
    given_reward = np.array([np.nan if r.reward is None else r.reward for r in rows])
    has_reward = np.array([r.reward is not None for r in rows], dtype=bool)
    reward = np.where(has_reward, given_reward, result.rewards)
    given_adv = np.array([np.nan if r.advantage is None else r.advantage for r in rows])
    advantage = np.where(np.isnan(given_adv), result.advantages, given_adv)
    # Sums of huge finite values can overflow float64: store "unknown" (NULL), never an infinity that
    # no JSON response can carry.
    reward = np.where(np.isfinite(reward), reward, np.nan)
    advantage = np.where(np.isfinite(advantage), advantage, np.nan)
    agg = stats.group_stats(reward, gid, len(groups))
    comp = stats.group_stats(matrix, gid, len(groups)) if k else None
    return {
        "matrix": matrix,
        "reward": reward,
        "advantage": advantage,
        "gid": gid,
        "agg": agg,
        "comp": comp,
    }


def _f(x: float) -> float | None:
    return (
        None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)
    )  # NaN, overflow


def ingest_groups(run: Run, body: Any) -> IngestResult:
    """Validate and store a batch of groups for `run`. All or nothing; idempotent on (step, key)."""
    comps = run.components()
    groups = validate_batch(body, {c.name for c in comps})
    for attempt in range(RETRIES):
        try:
            return _store(run, groups, comps)
        except (IntegrityError, OperationalError) as e:
            # A concurrent batch with some of the same groups committed first (unique violation) or
            # wrote them in another order (deadlock): our transaction rolled back whole, and the retry
            # skips the groups that are now stored.
            if isinstance(e, IntegrityError) and not Run.objects.filter(id=run.id).exists():
                # Deleted while we wrote (its job is being stopped): a refusal, not a crash in the trainer.
                raise FieldError("run", f"run {run.id} was deleted") from None
            if attempt == RETRIES - 1 or not _lost_race(e):
                raise
    raise AssertionError("unreachable")


RETRIES = 3


def _lost_race(e: Exception) -> bool:
    import psycopg.errors as pg

    return isinstance(e, IntegrityError) or isinstance(
        e.__cause__, (pg.DeadlockDetected, pg.SerializationFailure)
    )


@transaction.atomic
def _store(run: Run, groups: list[_Group], comps: list[RewardComponent]) -> IngestResult:
    existing: set[tuple[int, str]] = set()
    steps = {g.step for g in groups}
    if groups:
        existing = set(
            Group.objects.filter(
                run=run, step__in=steps, key__in={g.key for g in groups}
            ).values_list("step", "key")
        )
    new = [g for g in groups if (g.step, g.key) not in existing]
    if not new:
        return IngestResult(groups=0, rollouts=0, skipped_groups=len(groups))
    c = _compute(run, new, comps)
    writer = _CopyWriter() if connection.vendor == "postgresql" else _OrmWriter()
    writer.write(run, new, comps, c)
    upsert_step_stats(run.id, step_stat_rows(np.array([g.step for g in new]), comps, c))
    return IngestResult(
        groups=len(new), rollouts=int(c["gid"].size), skipped_groups=len(groups) - len(new)
    )


def _group_rows(run: Run, groups: list[_Group], c: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    agg = c["agg"]
    rows = []
    for gi, g in enumerate(groups):
        std = _f(agg.std[gi])
        all_nan = agg.count[gi] == 0
        rows.append(
            dict(
                run_id=run.id,
                step=g.step,
                key=g.key,
                prompt=g.prompt,
                prompt_text=g.prompt_text,
                split=g.split,
                size=len(g.rollouts),
                reward_mean=_f(agg.mean[gi]),
                reward_std=std,
                zero_std=bool(all_nan or std is None or std <= stats.ZERO_STD_ATOL),
                all_unscorable=bool(all_nan),
            )
        )
    return rows


def _packed_scores(
    groups: list[_Group], c: dict[str, np.ndarray], rollout_ids: list[int]
) -> list[bytes]:
    """Each group's Group.packed_scores blob; `rollout_ids` in the batch's rollout order."""
    lengths = np.array(
        [np.nan if r.length is None else r.length for g in groups for r in g.rollouts],
        dtype=np.float64,
    )
    return packed.pack_groups(
        np.asarray(rollout_ids, dtype=np.int64),
        lengths,
        c["matrix"],
        [len(g.rollouts) for g in groups],
    )


class _OrmWriter:
    """SQLite (and any non-Postgres) path: bulk_create, which returns primary keys there."""

    def write(
        self, run: Run, groups: list[_Group], comps: list[RewardComponent], c: dict[str, np.ndarray]
    ) -> None:
        # packed_scores (NOT NULL) is filled below, in this transaction, once the rollouts have their ids.
        group_objs = Group.objects.bulk_create(
            [Group(**row, packed_scores=b"") for row in _group_rows(run, groups, c)], batch_size=500
        )
        rollouts, flat = [], []
        for gi, g in enumerate(groups):
            for r in g.rollouts:
                i = len(flat)
                flat.append(r)
                rollouts.append(
                    Rollout(
                        group_id=group_objs[gi].id,
                        run_id=run.id,
                        step=g.step,
                        split=g.split,
                        index=r.index,
                        transcript=r.transcript,
                        completion=r.completion,
                        reward=_f(c["reward"][i]),
                        advantage=_f(c["advantage"][i]),
                        length=r.length,
                        truncated=r.truncated,
                        finish_reason=r.finish_reason,
                        parse_error=r.parse_error,
                        state=r.state,
                        preview_head=r.summary.head,
                        preview_tail=r.summary.tail,
                        n_turns=r.summary.turns,
                        n_tool_calls=r.summary.tool_calls,
                        text_chars=r.summary.chars,
                        search_text=r.search_text,
                    )
                )
        Rollout.objects.bulk_create(rollouts, batch_size=500)
        # The blob needs the rollout ids, which exist only now: one UPDATE per group, same transaction.
        header = packed.header([comp.id for comp in comps])
        blobs = _packed_scores(groups, c, [ro.id for ro in rollouts])
        with connection.cursor() as cur:
            cur.executemany(
                "UPDATE rollouts_group SET packed_scores = %s, packed_components = %s WHERE id = %s",
                [(blob, header, g.id) for blob, g in zip(blobs, group_objs)],
            )
        scores = [
            RewardScore(
                rollout_id=ro.id,
                component_id=comp.id,
                run_id=run.id,
                step=ro.step,
                value=_f(c["matrix"][i, j]),
                reason=flat[i].rewards.get(comp.name, (0.0, ""))[1],
            )
            for i, ro in enumerate(rollouts)
            for j, comp in enumerate(comps)
            if comp.name in flat[i].rewards
        ]
        RewardScore.objects.bulk_create(scores, batch_size=1000)
        GroupComponentStat.objects.bulk_create(
            [
                GroupComponentStat(**row)
                for row in _stat_rows(run, groups, comps, c, [g.id for g in group_objs])
            ],
            batch_size=1000,
        )


def _stat_rows(
    run: Run,
    groups: list[_Group],
    comps: list[RewardComponent],
    c: dict[str, np.ndarray],
    group_ids: list[int],
) -> list[dict[str, Any]]:
    cs = c["comp"]
    rows = []
    for gi, g in enumerate(groups):
        for j, comp in enumerate(comps):
            count = int(cs.count[gi, j])
            if count == 0:
                continue  # the component never scored this group: nothing to say
            std = _f(cs.std[gi, j])
            rows.append(
                dict(
                    group_id=group_ids[gi],
                    component_id=comp.id,
                    run_id=run.id,
                    step=g.step,
                    count=count,
                    mean=_f(cs.mean[gi, j]),
                    std=std,
                    min=_f(cs.min[gi, j]),
                    max=_f(cs.max[gi, j]),
                    zero_std=bool(std is None or std <= stats.ZERO_STD_ATOL),
                )
            )
    return rows


def _next_ids(cur: Any, table: str, n: int) -> list[int]:
    cur.execute(
        f"SELECT nextval(pg_get_serial_sequence('{table}', 'id')) FROM generate_series(1, %s)", [n]
    )
    return [row[0] for row in cur.fetchall()]


class _CopyWriter:
    """Postgres path: ids drawn from the sequences, then COPY for every table (psycopg 3)."""

    def write(
        self, run: Run, groups: list[_Group], comps: list[RewardComponent], c: dict[str, np.ndarray]
    ) -> None:
        # COPY runs on the raw psycopg cursor, past Django's error translation: wrap_database_errors
        # restores it, so a concurrent identical batch (psycopg's UniqueViolation) arrives as Django's
        # IntegrityError, which ingest_groups retries.
        with connection.wrap_database_errors, connection.cursor() as django_cur:
            cur = django_cur.cursor  # the psycopg 3 cursor under Django's wrapper
            group_ids = _next_ids(cur, "rollouts_group", len(groups))
            n = int(c["gid"].size)
            rollout_ids = _next_ids(cur, "rollouts_rollout", n)
            g_cols = (
                "id",
                "run_id",
                "step",
                "key",
                "prompt",
                "prompt_text",
                "split",
                "size",
                "reward_mean",
                "reward_std",
                "zero_std",
                "all_unscorable",
                "packed_scores",
                "packed_components",
            )
            header = packed.header([comp.id for comp in comps])
            blobs = _packed_scores(groups, c, rollout_ids)
            with cur.copy(f"COPY rollouts_group ({', '.join(g_cols)}) FROM STDIN") as cp:
                for gid, blob, row in zip(group_ids, blobs, _group_rows(run, groups, c)):
                    row["id"], row["prompt"] = gid, dumps(row["prompt"])
                    row["packed_scores"], row["packed_components"] = blob, header
                    cp.write_row([row[k] for k in g_cols])
            reward, advantage, matrix = (
                c["reward"].tolist(),
                c["advantage"].tolist(),
                c["matrix"].tolist(),
            )
            r_cols = (
                "id",
                "group_id",
                "run_id",
                "step",
                "split",
                "index",
                "transcript",
                "completion",
                "reward",
                "advantage",
                "length",
                "truncated",
                "finish_reason",
                "parse_error",
                "state",
                "preview_head",
                "preview_tail",
                "n_turns",
                "n_tool_calls",
                "text_chars",
                "search_text",
            )
            score_rows = []
            comp_ids = [comp.id for comp in comps]
            names = [comp.name for comp in comps]
            run_id = run.id
            with cur.copy(f"COPY rollouts_rollout ({', '.join(r_cols)}) FROM STDIN") as cp:
                i = 0
                for gi, g in enumerate(groups):
                    for r in g.rollouts:
                        rid = rollout_ids[i]
                        rw, adv = reward[i], advantage[i]
                        sm = r.summary
                        cp.write_row(
                            (
                                rid,
                                group_ids[gi],
                                run_id,
                                g.step,
                                g.split,
                                r.index,
                                dumps(r.transcript),
                                r.completion,
                                None if rw != rw else rw,
                                None if adv != adv else adv,
                                r.length,
                                r.truncated,
                                r.finish_reason,
                                r.parse_error,
                                None if r.state is None else dumps(r.state),
                                sm.head,
                                sm.tail,
                                sm.turns,
                                sm.tool_calls,
                                sm.chars,
                                r.search_text,
                            )
                        )
                        vals = matrix[i]
                        rewards = r.rewards
                        for j, name in enumerate(names):
                            got = rewards.get(name)
                            if got is not None:
                                v = vals[j]
                                score_rows.append(
                                    (
                                        rid,
                                        comp_ids[j],
                                        run_id,
                                        g.step,
                                        None if v != v else v,
                                        got[1],
                                    )
                                )
                        i += 1
            with cur.copy(
                "COPY rollouts_rewardscore (rollout_id, component_id, run_id, step, value, reason) "
                "FROM STDIN"
            ) as cp:
                for row in score_rows:
                    cp.write_row(row)
            s_cols = (
                "group_id",
                "component_id",
                "run_id",
                "step",
                "count",
                "mean",
                "std",
                "min",
                "max",
                "zero_std",
            )
            with cur.copy(
                f"COPY rollouts_groupcomponentstat ({', '.join(s_cols)}) FROM STDIN"
            ) as cp:
                for row in _stat_rows(run, groups, comps, c, group_ids):
                    cp.write_row([row[k] for k in s_cols])


HUGE = 1e150  # per-batch sums past this could overflow float8 when added up in SQL
STEP_STAT_COLUMNS = (
    "n_groups",
    "n_zero_std",
    "n_group_std",
    "sum_group_std",
    "n_rollouts",
    "n_values",
    "sum_values",
    "sum_squares",
)


def _column_step_stats(
    gmask: np.ndarray,
    rmask: np.ndarray,
    values: np.ndarray,
    count: np.ndarray,
    std: np.ndarray,
    zero: np.ndarray,
    all_groups: bool,
) -> tuple:
    has = np.ones(int(gmask.sum()), dtype=bool) if all_groups else count[gmask] > 0
    stdv = std[gmask]
    defined = ~np.isnan(stdv)
    vals = values[rmask]
    vals = vals[~np.isnan(vals)]
    with np.errstate(over="ignore", invalid="ignore"):
        total, squares = float(vals.sum()), float((vals * vals).sum())
        std_sum = float(stdv[defined].sum())
    # Postgres raises on a float8 sum that overflows. NULL instead: NULL + x stays NULL in SQL (both
    # databases; SQLite would turn a NaN into NULL anyway), and the dashboard shows the step as missing.
    # Statistics of values this large are meaningless.
    std_sum: float | None = std_sum if abs(std_sum) < HUGE else None
    if not (abs(total) < HUGE and squares < HUGE):
        total = squares = None
    return (
        int(has.sum()),
        int((zero[gmask] & has).sum()),
        int(defined.sum()),
        std_sum,
        int(rmask.sum()),
        int(vals.size),
        total,
        squares,
    )


def step_stat_rows(
    group_steps: np.ndarray, comps: list[RewardComponent], c: dict[str, Any]
) -> list[tuple]:
    """(step, component_id, *STEP_STAT_COLUMNS) for a batch: one row per step and column, where
    component_id 0 is the aggregate reward. A loop over steps x columns, never over rollouts."""
    rollout_steps = group_steps[c["gid"]]
    agg, cs = c["agg"], c["comp"]
    group_zero = agg.zero_std | (
        agg.count == 0
    )  # as Group.zero_std: no signal, or nothing to score
    rows = []
    for step in np.unique(group_steps).tolist():
        gmask, rmask = group_steps == step, rollout_steps == step
        rows.append(
            (
                step,
                0,
                *_column_step_stats(
                    gmask, rmask, c["reward"], agg.count, agg.std, group_zero, True
                ),
            )
        )
        for j, comp in enumerate(comps):
            count, std = cs.count[:, j], cs.std[:, j]
            zero = ~(np.nan_to_num(std, nan=0.0) > stats.ZERO_STD_ATOL)
            rows.append(
                (
                    step,
                    comp.id,
                    *_column_step_stats(gmask, rmask, c["matrix"][:, j], count, std, zero, False),
                )
            )
    return rows


def upsert_step_stats(run_id: int, rows: list[tuple]) -> None:
    """Add a batch's sufficient statistics to StepStat (INSERT ... ON CONFLICT DO UPDATE: Postgres, SQLite)."""
    if not rows:
        return
    cols = ", ".join(STEP_STAT_COLUMNS)
    marks = ", ".join(["%s"] * (3 + len(STEP_STAT_COLUMNS)))
    updates = ", ".join(f"{k} = rollouts_stepstat.{k} + excluded.{k}" for k in STEP_STAT_COLUMNS)
    sql = (
        f"INSERT INTO rollouts_stepstat (run_id, step, component_id, {cols}) VALUES ({marks}) "
        f"ON CONFLICT (run_id, step, component_id) DO UPDATE SET {updates}"
    )
    with connection.cursor() as cur:
        cur.executemany(sql, [(run_id, *row) for row in rows])
