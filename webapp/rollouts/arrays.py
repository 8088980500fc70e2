"""Reading a run into arrays (`training.diagnostics.RunArrays`): the one reader of a run's scores.

It reads only the groups' packed score blobs (`Group.packed_scores`, layout in Group's docstring),
one row per group, never the rollout and score rows: at a million rollouts (125k groups, 4M score
rows) the rows take 4-10 s to read on a 2-core box even packed by Postgres itself, the blobs ~0.5 s
(bench/ablation.py). On Postgres the database concatenates the blobs of the selected groups (one
bytea per component header, `string_agg`, no sort) and numpy views them in place; SQLite (the
embedded default, small runs) reads the blobs with a plain cursor. A blob that does not match its
group's size is refused with an error naming the group: the answer never silently changes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from django.db import DEFAULT_DB_ALIAS, connection

from training import diagnostics as dg
from webapp.rollouts import packed
from webapp.runs.models import Run

CHUNK_ROLLOUTS = 1_000_000  # rollouts per query: each aggregated bytea stays far below the 1 GB cap
# Connections reading a run of several chunks at once (one Postgres backend, one core, each).
READ_CONNECTIONS = 2

# One row per distinct header: the groups' (id, step, size) and their blobs concatenated in the same
# row order (both aggregates consume the same input rows), so no ORDER BY (a sort) is needed.
_META_DT = np.dtype([("id", ">i8"), ("step", ">i4"), ("size", ">i4")])
_PACK_SQL = (
    "SELECT packed_components, string_agg(int8send(id) || int4send(step) || int4send(size), "
    "''::bytea), string_agg(packed_scores, ''::bytea) FROM rollouts_group WHERE {where} GROUP BY "
    "packed_components"
)
_Pack = tuple[
    str, np.ndarray, bytes
]  # (component header, the groups' meta, their blobs concatenated)


def _where(run_id: int, step_min: int | None) -> str:
    return f"run_id = {int(run_id)}" + ("" if step_min is None else f" AND step >= {int(step_min)}")


def _chunks(where: str, expected: int) -> list[str]:
    """Group-id ranges of about CHUNK_ROLLOUTS rollouts each (one, unbounded, for a
    run below that)."""
    if expected <= CHUNK_ROLLOUTS:
        return [""]
    with connection.cursor() as cur:
        cur.execute(f"SELECT min(id), max(id) FROM rollouts_group WHERE {where}")
        lo, hi = cur.fetchone()
    if lo is None:
        return []
    width = max(1, (hi - lo + 1) * CHUNK_ROLLOUTS // expected)
    return [f" AND id BETWEEN {a} AND {a + width - 1}" for a in range(lo, hi + 1, width)]


def _fetch_chunk(cur, sql: str) -> list[_Pack]:
    cur.execute(sql, binary=True)
    return [
        (header, packed.records(bytes(meta), _META_DT), b"" if blob is None else bytes(blob))
        for header, meta, blob in cur.fetchall()
    ]


def _chunk_on_own_connection(sql: str) -> list[_Pack]:
    """One chunk read on this thread's own connection (Django's connections are per thread),
    closed before the thread ends."""
    import psycopg
    from django.db import connections

    conn = connections[DEFAULT_DB_ALIAS]
    try:
        conn.ensure_connection()
        with psycopg.Cursor(conn.connection) as cur:
            return _fetch_chunk(cur, sql)
    finally:
        conn.close()


def _packs_postgres(where: str, expected: int) -> list[_Pack]:
    """One query per chunk; a run of several chunks is read READ_CONNECTIONS chunks at a time,
    each on its own connection: Postgres runs one backend per connection, so a whole-run read
    (the cold ablation at 10M rollouts: 5 chunks) uses more than one core. Chunks are group-id
    ranges, each its own statement as before, so the result is the same in any order."""
    import psycopg  # binary results: Django's cursor binds client-side and cannot return them

    sqls = [_PACK_SQL.format(where=where + bound) for bound in _chunks(where, expected)]
    if len(sqls) > 1 and READ_CONNECTIONS > 1 and not connection.in_atomic_block:
        with ThreadPoolExecutor(max_workers=READ_CONNECTIONS) as pool:
            return [p for part in pool.map(_chunk_on_own_connection, sqls) for p in part]
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cur:
        return [p for sql in sqls for p in _fetch_chunk(cur, sql)]


def _packs_generic(where: str) -> list[_Pack]:
    by_header: dict[str, tuple[list[tuple[int, int, int]], list[bytes]]] = {}
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, step, size, packed_components, packed_scores FROM rollouts_group WHERE "
            f"{where}"
        )
        for gid, step, size, header, blob in cur.fetchall():
            meta, blobs = by_header.setdefault(header or "", ([], []))
            meta.append((gid, step, size))
            blobs.append(b"" if blob is None else bytes(blob))
    return [
        (h, np.array(meta, dtype=_META_DT), b"".join(blobs))
        for h, (meta, blobs) in by_header.items()
    ]


def _unpack(pack: _Pack, component_ids: list[int]) -> dict[str, np.ndarray]:
    """One header's groups as aligned arrays, columns in `component_ids` order (NaN: not scored)."""
    header, meta, blob = pack
    cols = packed.parse_header(header)
    sizes = meta["size"].astype(np.int64)
    try:
        rec = packed.unpack(blob, len(cols))
    except ValueError:
        rec = None
    if rec is None or rec.size != int(sizes.sum()):
        raise ValueError(
            f"Group.packed_scores: the blobs of groups {meta['id'][:5].tolist()}... (header "
            f"{header!r}) do not hold their {int(sizes.sum())} rollouts"
        )
    matrix = np.full((rec.size, len(component_ids)), np.nan)
    position = {c: j for j, c in enumerate(cols)}
    for j, cid in enumerate(component_ids):
        if cid in position:  # else: added to the environment after these groups were stored, NaN
            matrix[:, j] = rec["values"][:, position[cid]]
    return {
        "ids": rec["id"].astype(np.int64),
        "group_ids": np.repeat(meta["id"].astype(np.int64), sizes),
        "steps": np.repeat(meta["step"].astype(np.int64), sizes),
        "lengths": rec["length"].astype(np.float64),
        "matrix": matrix,
    }


def read(
    run_id: int, component_ids: list[int], step_min: int | None = None, expected: int = 0
) -> dict[str, np.ndarray]:
    """The run's rollouts (from `step_min` on) as aligned arrays: ids, group_ids, steps,
    lengths (NaN: unknown) and an (N, K) matrix. `expected` (rollouts) only sizes the chunks of
    a very large run."""
    where = _where(run_id, step_min)
    packs = (
        _packs_postgres(where, expected)
        if connection.vendor == "postgresql"
        else _packs_generic(where)
    )
    parts = [_unpack(p, component_ids) for p in packs]
    if not parts:
        e = np.zeros(0, dtype=np.int64)
        return {
            "ids": e,
            "group_ids": e,
            "steps": e,
            "lengths": np.zeros(0),
            "matrix": np.zeros((0, len(component_ids))),
        }
    return (
        parts[0]
        if len(parts) == 1
        else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    )


def load_run_arrays(run: Run, *, step_min: int | None = None) -> dg.RunArrays:
    """Every rollout of the run (from `step_min` on) as arrays, components in environment order."""
    comps = run.components()
    weights = run.reward_weights(comps)
    a = read(run.id, [c.id for c in comps], step_min=step_min, expected=run_rollouts(run))
    infos = [
        dg.ComponentInfo(c.name, weights[c.name], c.kind, c.min_value, c.max_value) for c in comps
    ]
    return dg.RunArrays(
        components=infos,
        matrix=a["matrix"],
        group_ids=a["group_ids"],
        steps=a["steps"],
        lengths=a["lengths"],
        rollout_ids=a["ids"],
    )


def run_rollouts(run: Run, step_min: int | None = None) -> int:
    """The run's rollouts (from `step_min` on) as its per-step statistics count them: one row per
    step, not a sum over every group (it only sizes the read's chunks)."""
    from django.db.models import Sum

    from webapp.rollouts.models import StepStat

    rows = StepStat.objects.filter(run=run, component_id=0)
    if step_min is not None:
        rows = rows.filter(step__gte=step_min)
    return int(rows.aggregate(n=Sum("n_rollouts"))["n"] or 0)
