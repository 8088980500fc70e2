"""Writing a batch's rows (webapp/rollouts/rows.py): Postgres COPY, or executemany INSERT on SQLite.

Both databases get the same tuples with their ids already set, so the rows of every table are built
once, before anything is written. Ids come from the tables' own sequences: Postgres draws them with
nextval (never handed out twice, even to a batch that rolls back); SQLite reads the AUTOINCREMENT
counter, which is safe because settings open every transaction with BEGIN IMMEDIATE (the single
write lock is held from the start, so no other writer can take the same ids).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection
from django.db.models import Model

from webapp.rollouts.ingest_stats import STEP_STAT_COLUMNS, StepStatRow
from webapp.rollouts.rows import Table


def reserve_ids(model: type[Model], n: int) -> list[int]:
    """`n` fresh primary keys for `model`'s table, for rows inserted with explicit ids."""
    table = model._meta.db_table
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
                [table, n],
            )
            return [row[0] for row in cur.fetchall()]
        if not connection.in_atomic_block:
            raise RuntimeError("reserve_ids on SQLite must run inside transaction.atomic")
        cur.execute("SELECT seq FROM sqlite_sequence WHERE name = %s", [table])
        seq = cur.fetchone()
        cur.execute(f"SELECT MAX(id) FROM {connection.ops.quote_name(table)}")
        top = max(seq[0] if seq else 0, cur.fetchone()[0] or 0)
        return list(range(top + 1, top + 1 + n))


def insert(tables: Sequence[Table]) -> None:
    """Insert every table's rows, in order, in the caller's transaction."""
    q = connection.ops.quote_name
    # COPY runs on the raw psycopg cursor, past Django's error translation: wrap_database_errors
    # restores it, so a concurrent identical batch (psycopg's UniqueViolation) arrives as Django's
    # IntegrityError, which ingest_groups retries.
    with connection.wrap_database_errors, connection.cursor() as cur:
        for t in tables:
            if isinstance(t.rows, list) and not t.rows:
                continue
            columns = ", ".join(q(c) for c in t.columns)
            if connection.vendor == "postgresql":
                with cur.cursor.copy(f"COPY {q(t.name)} ({columns}) FROM STDIN") as cp:
                    for row in t.rows:
                        cp.write_row(row)
            else:
                marks = ", ".join(["%s"] * len(t.columns))
                cur.executemany(f"INSERT INTO {q(t.name)} ({columns}) VALUES ({marks})", t.rows)


def upsert_step_stats(run_id: int, rows: list[StepStatRow]) -> None:
    """Add a batch's sufficient statistics to StepStat (INSERT ... ON CONFLICT DO UPDATE: Postgres,
    SQLite). A NULL sum stays NULL: an overflowed step stays missing."""
    if not rows:
        return
    cols = ", ".join(STEP_STAT_COLUMNS)
    marks = ", ".join(["%s"] * (1 + len(StepStatRow._fields)))
    updates = ", ".join(f"{k} = rollouts_stepstat.{k} + excluded.{k}" for k in STEP_STAT_COLUMNS)
    sql = (
        f"INSERT INTO rollouts_stepstat (run_id, step, component_id, {cols}) VALUES ({marks}) "
        f"ON CONFLICT (run_id, step, component_id) DO UPDATE SET {updates}"
    )
    with connection.cursor() as cur:
        cur.executemany(sql, [(run_id, *row) for row in rows])


def add_vocabulary(run_id: int, word_sets: Sequence[set[str] | None]) -> None:
    """Add the words of a batch's search documents (text.search_words) to the run's vocabulary
    (SearchWord), Postgres only. Call it last in the batch's transaction: it locks new words in
    sorted order, after every other lock the batch takes, so concurrent batches cannot deadlock on
    them (a batch that adds a word another has just added waits for that one's commit)."""
    if connection.vendor != "postgresql":
        return
    words: set[str] = set().union(*(w for w in word_sets if w))
    if not words:
        return
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO rollouts_searchword (run_id, word) SELECT %s, w "
            "FROM unnest(%s::text[]) AS w ORDER BY w ON CONFLICT DO NOTHING",
            [run_id, sorted(words)],
        )
