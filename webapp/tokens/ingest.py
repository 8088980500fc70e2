"""The token part of a batch's ingestion (webapp/rollouts/ingest.py calls `store` in the batch's
transaction, after the rollout rows): one RolloutTokens row per rollout that carries tokens and the
batch's additions to TokenStepStat.

On Postgres the rows go through a binary COPY, each written as soon as it is encoded: the blob
travels as its own bytes (text COPY doubles them as hex), and Postgres stores one row while this
process encodes the next (docs/tokens.md, "Performance").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain

from django.db import connection

from webapp.rollouts.ingest_write import insert
from webapp.rollouts.rows import Table
from webapp.rollouts.validation import GroupIn
from webapp.tokens import codec, stats
from webapp.tokens.models import RolloutTokens, TokenStepStat

TOKEN_COLUMNS = (
    "rollout_id",
    "run_id",
    "step",
    "n_tokens",
    "fields",
    "data",
    "mismatch",
    "max_mismatch",
    "mean_entropy",
    "masked_fraction",
    "tool_unmasked",
)
# Postgres types of TOKEN_COLUMNS, for the binary COPY (which sends each value in its column's
# own binary form, so the types must be the columns' exact ones).
TOKEN_TYPES = (
    "int8", "int8", "int4", "int4", "varchar", "bytea", "float8", "float8", "float8", "float8",
    "int4",
)  # fmt: skip
STEP_COLUMNS = stats.TokenSums._fields


def token_rows(
    run_id: int, groups: list[GroupIn], rollout_ids: list[int]
) -> tuple[list[tuple], dict[int, stats.TokenSums]]:
    """RolloutTokens rows (TOKEN_COLUMNS) of the batch's rollouts that carry tokens, and the
    batch's token sums by step. `rollout_ids` are the batch's rollouts' ids in batch order."""
    by_step: dict[int, list[stats.TokenSums]] = {}
    rows = list(_rows(run_id, groups, rollout_ids, by_step))
    return rows, _step_sums(by_step)


def _step_sums(by_step: dict[int, list[stats.TokenSums]]) -> dict[int, stats.TokenSums]:
    return {step: stats.add(s) for step, s in by_step.items()}  # type: ignore[misc]


def _rows(
    run_id: int,
    groups: list[GroupIn],
    rollout_ids: list[int],
    by_step: dict[int, list[stats.TokenSums]],
) -> Iterator[tuple]:
    """The rows of `token_rows`, one at a time; each rollout's sums go into `by_step`."""
    i = 0
    for g in groups:
        for r in g.rollouts:
            t = r.tokens
            if t is not None:
                roles = [str(m.get("role", "")) for m in r.transcript]
                sums = stats.rollout_sums(t, roles)
                by_step.setdefault(g.step, []).append(sums)
                fields = ",".join(t.present())
                blob = codec.encode(t)
                summary = stats.summary(sums, t, roles)
                yield (rollout_ids[i], run_id, g.step, len(t), fields, blob, *summary)
            i += 1


def store(run_id: int, groups: list[GroupIn], rollout_ids: list[int]) -> int:
    """Write the batch's token rows and step sums; the number of rollouts with tokens."""
    by_step: dict[int, list[stats.TokenSums]] = {}
    n = copy_rows(_rows(run_id, groups, rollout_ids, by_step))
    if n:
        upsert_steps(run_id, _step_sums(by_step))
    return n


def copy_rows(rows: Iterable[tuple]) -> int:
    """Insert RolloutTokens rows (TOKEN_COLUMNS) in the caller's transaction, consuming `rows` as
    they come: a binary COPY on Postgres, `insert` elsewhere. The number of rows."""
    if connection.vendor != "postgresql":
        rows = list(rows)
        insert([Table(RolloutTokens._meta.db_table, TOKEN_COLUMNS, rows)])
        return len(rows)
    it = iter(rows)
    first = next(it, None)
    if first is None:  # a batch without tokens runs no COPY at all
        return 0
    q = connection.ops.quote_name
    sql = (
        f"COPY {q(RolloutTokens._meta.db_table)} ({', '.join(map(q, TOKEN_COLUMNS))}) "
        "FROM STDIN (FORMAT BINARY)"
    )
    n = 0
    # wrap_database_errors: a concurrent identical batch's UniqueViolation arrives as Django's
    # IntegrityError, which ingest_groups retries (as in ingest_write.insert).
    with connection.wrap_database_errors, connection.cursor() as cur, cur.cursor.copy(sql) as cp:
        cp.set_types(TOKEN_TYPES)
        for row in chain((first,), it):
            cp.write_row(row)
            n += 1
    return n


def upsert_steps(run_id: int, steps: dict[int, stats.TokenSums]) -> None:
    """Add a batch's sums to TokenStepStat (INSERT ... ON CONFLICT DO UPDATE, both databases); in
    step order, so concurrent batches lock the rows in the same order."""
    table = TokenStepStat._meta.db_table
    greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    cols = [c for c in STEP_COLUMNS]
    sets = [
        f"{c} = {table}.{c} + excluded.{c}"
        if c != "max_abs_delta"
        else f"{c} = COALESCE({greatest}({table}.{c}, excluded.{c}), {table}.{c}, excluded.{c})"
        for c in cols
    ]
    marks = ", ".join(["%s"] * (2 + len(cols)))
    sql = (
        f"INSERT INTO {table} (run_id, step, {', '.join(cols)}) VALUES ({marks}) "
        f"ON CONFLICT (run_id, step) DO UPDATE SET {', '.join(sets)}"
    )
    with connection.cursor() as cur:
        cur.executemany(sql, [(run_id, step, *steps[step]) for step in sorted(steps)])
