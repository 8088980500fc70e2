"""The token part of a batch's ingestion (webapp/rollouts/ingest.py calls `store` in the batch's
transaction, after the rollout rows): one RolloutTokens row per rollout that carries tokens (COPY on
Postgres, like the other tables) and the batch's additions to TokenStepStat.
"""

from __future__ import annotations

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
STEP_COLUMNS = stats.TokenSums._fields


def token_rows(
    run_id: int, groups: list[GroupIn], rollout_ids: list[int]
) -> tuple[list[tuple], dict[int, stats.TokenSums]]:
    """RolloutTokens rows (TOKEN_COLUMNS) of the batch's rollouts that carry tokens, and the
    batch's token sums by step. `rollout_ids` are the batch's rollouts' ids in batch order."""
    rows: list[tuple] = []
    by_step: dict[int, list[stats.TokenSums]] = {}
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
                rows.append(
                    (
                        rollout_ids[i],
                        run_id,
                        g.step,
                        len(t),
                        fields,
                        blob,
                        *stats.summary(sums, t, roles),
                    )
                )
            i += 1
    return rows, {step: stats.add(s) for step, s in by_step.items()}  # type: ignore[misc]


def store(run_id: int, groups: list[GroupIn], rollout_ids: list[int]) -> int:
    """Write the batch's token rows and step sums; the number of rollouts with tokens."""
    rows, steps = token_rows(run_id, groups, rollout_ids)
    if not rows:
        return 0
    insert([Table(RolloutTokens._meta.db_table, TOKEN_COLUMNS, rows)])
    upsert_steps(run_id, steps)
    return len(rows)


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
