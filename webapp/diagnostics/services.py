"""Reading a run into arrays fast, and the diagnostics and ablations built on them.

The reader is the hot path of an ablation at a million rollouts (125k groups, 4M score rows), and the
target (< 2 s end to end) includes the database read. Reading the rows is too slow on this project's
2-core box: the ORM builds a Python tuple per row (tens of seconds); psycopg hands COPY data back one
row per call (~20 s); even with Postgres packing the rows itself (`string_agg` of `int8send`/
`float8send`, which numpy reads in place) 1M rollout + 4M score rows take 4-10 s. So ingestion also
stores each group's score matrix as one blob (`Group.packed_scores`, layout in its docstring), and the
reader scans one row per group: Postgres concatenates the blobs of the selected groups (one bytea per
component header, `string_agg`, no sort) and numpy views them in place: ~0.4 s of query and 0.05 s of
decoding at 1M rollouts, 0.5-0.6 s read and ~1 s cold end to end (bench/ablation.py). Groups without
a blob (stored by something other than the ingestion service) are read from their rows, so results
never depend on which path served them (tests compare the two).
The assembled arrays of a large run are also cached on disk (VAR_DIR/cache/diagnostics, one .npz per
run; a warm read is ~0.08 s), keyed by the run's (groups, last group id, rollouts, component ids).
Ingestion only ever appends whole groups, so when the key has grown the cache reads just the new
rollouts (id above the cached maximum) and appends; a count mismatch (e.g. batches committed out of
id order) falls back to a full read. SQLite (the embedded default, small runs) uses plain cursors.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import Avg, Count, Max, Q, Sum

from training import ablation as abl
from training import diagnostics as dg
from training import stats
from webapp.rollouts import packed
from webapp.rollouts.ingest import run_components, run_weights
from webapp.rollouts.models import Group, GroupComponentStat, RewardComponent
from webapp.runs.models import Run, StepMetric

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 50  # steps: detectors speak about "now", and the window bounds the cost at any run size
MAX_WINDOW_ROLLOUTS = 250_000  # a page's window never reads more than this many rollouts
SLOT_WINDOW = 20  # steps the dashboard slot summarises: "now", and a bounded cost
SLOT_MAX_ROLLOUTS = 50_000  # the slot reads at most this many rollouts (its first view stays well under 1 s)
CACHE_SECONDS = 120  # annotations (the quality detector) may change without the rollout count changing
SLOT_SECONDS = 60  # the slot may lag a live run by this much instead of recomputing on every poll
SCALES, AGGREGATIONS = stats.SCALES, stats.AGGREGATIONS  # the ablation form offers the trainer's choices

# The annotations app appends callables fn(run) -> iterable of rollout ids annotated as bad cases (and
# optionally sets ANNOTATED_PROVIDERS the same way for the denominator). Empty: the detector is skipped.
BAD_CASE_PROVIDERS: list[Callable[[Run], Iterable[int]]] = []
ANNOTATED_PROVIDERS: list[Callable[[Run], Iterable[int]]] = []

# ------------------------------------------------------------------------------------------ reader

CACHE_MIN_ROLLOUTS = 50_000  # smaller runs read from the database in well under a second: no file
CHUNK_ROLLOUTS = 2_000_000  # rollouts per query: each aggregated bytea stays far below Postgres's 1 GB cap
_ROLLOUT_DT = np.dtype([("id", ">i8"), ("group_id", ">i8"), ("step", ">i4"), ("length", ">i4")])
_SCORE_DT = np.dtype([("rollout_id", ">i8"), ("component_id", ">i4"), ("value", ">f8")])
_ROLLOUT_PACK = ("string_agg(int8send(id) || int8send(group_id) || int4send(step) || "
                 "int4send(COALESCE(length, -1)), ''::bytea)")
_SCORE_PACK = ("string_agg(int8send(rollout_id) || int4send(component_id::int4) || "
               "float8send(COALESCE(value, 'NaN'::float8)), ''::bytea)")


@dataclass
class _Raw:
    """Rows as read: rollouts (ids, group ids, steps, lengths) and scores (rollout id, component id, value)."""

    ids: np.ndarray
    group_ids: np.ndarray
    steps: np.ndarray
    lengths: np.ndarray
    s_rollout: np.ndarray
    s_component: np.ndarray
    s_value: np.ndarray


def _fetch_packed(sql: str) -> bytes:
    """One bytea cell in binary (Django's cursor binds client-side and cannot return binary results)."""
    import psycopg

    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cur:
        cur.execute(sql, binary=True)
        row = cur.fetchone()
    return bytes(row[0]) if row and row[0] is not None else b""




def _run_where(run_id: int, step_min: int | None) -> str:
    """The SQL filter shared by the rollout, score and group tables (each has run_id and step)."""
    return f"run_id = {int(run_id)}" + ("" if step_min is None else f" AND step >= {int(step_min)}")


def _read_rows_postgres(run_id: int, step_min: int | None, after_id: int | None, expected: int,
                        groups: np.ndarray | None) -> _Raw:
    where = _run_where(run_id, step_min)
    ranges: list[tuple[int | None, int | None]] = [(after_id, None)]
    if expected > CHUNK_ROLLOUTS and groups is None:
        with connection.cursor() as cur:
            cur.execute(f"SELECT min(id), max(id) FROM rollouts_rollout WHERE {where}"
                        + (f" AND id > {int(after_id)}" if after_id is not None else ""))
            lo, hi = cur.fetchone()
        ranges = [(a - 1, min(a + CHUNK_ROLLOUTS - 1, hi)) for a in range(lo, hi + 1, CHUNK_ROLLOUTS)] if lo else []
    only = "" if groups is None else f" AND group_id = ANY('{_int_array(groups)}'::bigint[])"
    rs, ss = [], []
    for above, upto in ranges:
        bound = (f" AND id > {int(above)}" if above is not None else "") + (f" AND id <= {int(upto)}" if upto else "")
        rollout_sql = f"SELECT {_ROLLOUT_PACK} FROM rollouts_rollout WHERE {where}{bound}{only}"
        r = packed.records(_fetch_packed(rollout_sql), _ROLLOUT_DT)
        if not r.size:
            continue
        score_bound = bound.replace(" id ", " rollout_id ")
        if groups is not None:
            score_bound = f" AND rollout_id = ANY('{_int_array(r['id'])}'::bigint[])"
        elif step_min is not None or above is not None:
            # A window's (or an append's) rollouts were ingested together, so their ids form a narrow range:
            # bounding rollout_id lets Postgres range-scan the (rollout, component) index instead of the table.
            score_bound = f" AND rollout_id BETWEEN {int(r['id'].min())} AND {int(r['id'].max())}"
        score_sql = f"SELECT {_SCORE_PACK} FROM rollouts_rewardscore WHERE {where}{score_bound}"
        ss.append(packed.records(_fetch_packed(score_sql), _SCORE_DT))
        rs.append(r)
    r = np.concatenate(rs) if rs else np.zeros(0, _ROLLOUT_DT)
    s = np.concatenate(ss) if ss else np.zeros(0, _SCORE_DT)
    return _Raw(r["id"].astype(np.int64), r["group_id"].astype(np.int64), r["step"].astype(np.int64),
                r["length"].astype(np.float64), s["rollout_id"].astype(np.int64),
                s["component_id"].astype(np.int64), s["value"].astype(np.float64))


def _int_array(values: np.ndarray) -> str:
    return "{" + ",".join(map(str, values.astype(np.int64).tolist())) + "}"


def _read_rows_generic(run_id: int, step_min: int | None, after_id: int | None, expected: int,
                       groups: np.ndarray | None) -> _Raw:
    where = _run_where(run_id, step_min)
    with connection.cursor() as cur:
        cur.execute(f"SELECT id, group_id, step, COALESCE(length, -1) FROM rollouts_rollout WHERE {where}"
                    + (f" AND id > {int(after_id)}" if after_id is not None else ""))
        r = np.array(cur.fetchall(), dtype=np.float64).reshape(-1, 4)
        cur.execute(f"SELECT rollout_id, component_id, value FROM rollouts_rewardscore WHERE {where}"
                    + (f" AND rollout_id > {int(after_id)}" if after_id is not None else ""))
        s = np.array([(a, b, math.nan if v is None else v) for a, b, v in cur.fetchall()],
                     dtype=np.float64).reshape(-1, 3)
    if groups is not None:  # small runs (SQLite): filter here rather than bind thousands of ids
        r = r[np.isin(r[:, 1].astype(np.int64), groups)]
    return _Raw(r[:, 0].astype(np.int64), r[:, 1].astype(np.int64), r[:, 2].astype(np.int64), r[:, 3],
                s[:, 0].astype(np.int64), s[:, 1].astype(np.int64), s[:, 2])


def _read_rows(run_id: int, step_min: int | None = None, after_id: int | None = None, expected: int = 0,
               groups: np.ndarray | None = None) -> _Raw:
    """The rollout and score rows (all of the selection, or only those of `groups`): the reader for
    groups stored without a packed blob, and the reference the packed reader is tested against."""
    reader = _read_rows_postgres if connection.vendor == "postgresql" else _read_rows_generic
    return reader(run_id, step_min, after_id, expected, groups)


# One row per distinct (header, packed or not): the groups' (id, step, size) and their blobs concatenated
# in the same row order (both aggregates consume the same input rows), so no ORDER BY (a sort) is needed.
_GROUP_META_DT = np.dtype([("id", ">i8"), ("step", ">i4"), ("size", ">i4")])
_GROUP_PACK = ("SELECT packed_components, packed_scores IS NULL, "
               "string_agg(int8send(id) || int4send(step) || int4send(size), ''::bytea), "
               "string_agg(packed_scores, ''::bytea) FROM rollouts_group WHERE {where} "
               "GROUP BY packed_components, packed_scores IS NULL")
_Pack = tuple[str | None, np.ndarray, bytes]  # (header, or None: not packed; group meta; concatenated blobs)


def _group_where(run_id: int, step_min: int | None, after_id: int | None) -> str:
    where = _run_where(run_id, step_min)
    if after_id is not None:  # the groups of the rollouts above after_id (their records are filtered below)
        where += (f" AND id IN (SELECT group_id FROM rollouts_rollout WHERE run_id = {int(run_id)} "
                  f"AND id > {int(after_id)})")
    return where


def _packs_postgres(run_id: int, step_min: int | None, after_id: int | None, expected: int) -> list[_Pack]:
    import psycopg

    where = _group_where(run_id, step_min, after_id)
    bounds = [""]
    if expected > CHUNK_ROLLOUTS:  # keep each aggregated bytea far below Postgres's 1 GB cap
        with connection.cursor() as cur:
            cur.execute(f"SELECT min(id), max(id) FROM rollouts_group WHERE {where}")
            lo, hi = cur.fetchone()
        width = max(1, (hi - lo + 1) * CHUNK_ROLLOUTS // expected) if lo is not None else 1
        bounds = [f" AND id BETWEEN {a} AND {a + width - 1}" for a in range(lo, hi + 1, width)] if lo else []
    out: list[_Pack] = []
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cur:
        for bound in bounds:
            cur.execute(_GROUP_PACK.format(where=where + bound), binary=True)
            for header, unpacked, meta, blob in cur.fetchall():
                out.append((None if unpacked else header, packed.records(bytes(meta), _GROUP_META_DT),
                            b"" if blob is None else bytes(blob)))
    return out


def _packs_generic(run_id: int, step_min: int | None, after_id: int | None, expected: int) -> list[_Pack]:
    classes: dict[tuple[str, bool], tuple[list[tuple[int, int, int]], list[bytes]]] = {}
    with connection.cursor() as cur:
        cur.execute("SELECT id, step, size, packed_components, packed_scores FROM rollouts_group "
                    f"WHERE {_group_where(run_id, step_min, after_id)}")
        for gid, step, size, header, blob in cur.fetchall():
            meta, blobs = classes.setdefault((header or "", blob is None), ([], []))
            meta.append((gid, step, size))
            blobs.append(b"" if blob is None else bytes(blob))
    return [(None if unpacked else header, np.array(meta, dtype=_GROUP_META_DT), b"".join(blobs))
            for (header, unpacked), (meta, blobs) in classes.items()]


def _unpack_groups(pack: _Pack, component_ids: list[int], after_id: int | None) -> dict[str, np.ndarray] | None:
    """The arrays of one header's groups (as _assemble builds them); None if the blobs do not match the
    groups' sizes (then the caller reads those groups' rows)."""
    header, meta, blob = pack
    cols = packed.parse_header(header or "")
    sizes = meta["size"].astype(np.int64)
    try:
        rec = packed.unpack(blob, len(cols))
    except ValueError:
        rec = None
    if rec is None or rec.size != int(sizes.sum()):
        log.warning("packed scores of %d groups do not match their sizes; reading their rows", meta.size)
        return None
    matrix = np.full((rec.size, len(component_ids)), np.nan)
    where = {c: j for j, c in enumerate(cols)}
    for j, cid in enumerate(component_ids):
        if cid in where:  # else: added to the environment after these groups were stored, NaN
            matrix[:, j] = rec["values"][:, where[cid]]
    out = {"ids": rec["id"].astype(np.int64), "group_ids": np.repeat(meta["id"].astype(np.int64), sizes),
           "steps": np.repeat(meta["step"].astype(np.int64), sizes), "lengths": rec["length"].astype(np.float64),
           "matrix": matrix}
    if after_id is not None:
        keep = out["ids"] > after_id
        out = {k: v[keep] for k, v in out.items()}
    return out


def _read(run_id: int, component_ids: list[int], step_min: int | None = None, after_id: int | None = None,
          expected: int = 0) -> dict[str, np.ndarray]:
    """The selected rollouts as aligned arrays (see _assemble), from the groups' packed blobs; groups
    without one (or with a damaged one) are read from their rows."""
    reader = _packs_postgres if connection.vendor == "postgresql" else _packs_generic
    parts, unpacked = [], []
    for pack in reader(run_id, step_min, after_id, expected):
        part = None if pack[0] is None else _unpack_groups(pack, component_ids, after_id)
        if part is None:
            unpacked.append(pack[1]["id"].astype(np.int64))
        else:
            parts.append(part)
    if unpacked or not parts:
        only = np.concatenate(unpacked) if parts else None  # nothing packed: every row of the selection
        parts.append(_assemble(_read_rows(run_id, step_min, after_id, expected, only), component_ids))
    return parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _positions(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Row position in `ids` of each value of `wanted`, -1 where absent. A lookup table when the ids are
    dense (one run's ids nearly always are), else a binary search."""
    if ids.size == 0 or wanted.size == 0:
        return np.full(wanted.shape, -1, dtype=np.int64)
    lo, hi = int(ids.min()), int(ids.max())
    inside = (wanted >= lo) & (wanted <= hi)
    out = np.full(wanted.shape, -1, dtype=np.int64)
    if hi - lo < 8 * ids.size + 1024:
        table = np.full(hi - lo + 1, -1, dtype=np.int64)
        table[ids - lo] = np.arange(ids.size)
        out[inside] = table[wanted[inside] - lo]
        return out
    order = np.argsort(ids, kind="stable")
    at = np.minimum(np.searchsorted(ids, wanted, sorter=order), ids.size - 1)
    found = ids[order[at]] == wanted
    out[found] = order[at[found]]
    return out


def _assemble(raw: _Raw, component_ids: list[int]) -> dict[str, np.ndarray]:
    """Rows into aligned arrays: an (N, K) matrix with columns in `component_ids` order, NaN = not scored."""
    lengths = raw.lengths.copy()
    lengths[lengths < 0] = np.nan
    matrix = np.full((raw.ids.size, len(component_ids)), np.nan)
    if raw.s_rollout.size and component_ids:
        col = np.full(max(component_ids) + 1, -1, dtype=np.int64)
        col[component_ids] = np.arange(len(component_ids))
        cols = col[np.minimum(raw.s_component, col.size - 1)]
        rows = _positions(raw.ids, raw.s_rollout)
        # A component no longer in the environment is ignored; so is a score whose rollout committed
        # between our two reads (read committed): the count check below then refuses to cache.
        ok = (raw.s_component < col.size) & (cols >= 0) & (rows >= 0)
        matrix[rows[ok], cols[ok]] = raw.s_value[ok]
    return {"ids": raw.ids, "group_ids": raw.group_ids, "steps": raw.steps, "lengths": lengths, "matrix": matrix}


def _shape_key(run: Run, component_ids: list[int]) -> dict[str, Any]:
    g = Group.objects.filter(run=run).aggregate(groups=Count("id"), last=Max("id"), rollouts=Sum("size"))
    return {"groups": g["groups"], "last": g["last"] or 0, "rollouts": g["rollouts"] or 0, "components": component_ids}


def _cache_path(run_id: int) -> Path:
    return Path(settings.VAR_DIR) / "cache" / "diagnostics" / f"run-{int(run_id)}.npz"


def _cache_read(run_id: int) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    try:
        with np.load(_cache_path(run_id), allow_pickle=False) as z:
            arrays = {k: z[k] for k in ("ids", "group_ids", "steps", "lengths", "matrix")}
            key = json.loads(str(z["key"]))
        return key, arrays
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        return None  # absent, or half-written by a process that died: read from the database


def _cache_write(run_id: int, key: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    path = _cache_path(run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp.npz")
    np.savez(tmp, key=np.array(json.dumps(key)), **arrays)
    os.replace(tmp, path)  # readers see the old file or the new one, never half of one


def _full_arrays(run: Run, component_ids: list[int]) -> dict[str, np.ndarray]:
    """Every rollout of the run, through the on-disk cache for large runs."""
    key = _shape_key(run, component_ids)
    if key["rollouts"] < CACHE_MIN_ROLLOUTS:
        return _read(run.id, component_ids, expected=key["rollouts"])
    hit = _cache_read(run.id)
    if hit is not None and hit[0] == key:
        return hit[1]
    arrays = None
    if hit is not None:
        old_key, old = hit
        grew = (old_key["components"] == component_ids and key["last"] > old_key["last"]
                and key["rollouts"] > old_key["rollouts"] and old["ids"].size == old_key["rollouts"])
        if grew:
            after = int(old["ids"].max()) if old["ids"].size else 0
            new = _read(run.id, component_ids, after_id=after, expected=key["rollouts"] - old_key["rollouts"])
            arrays = {k: np.concatenate([old[k], new[k]]) for k in old}
            if arrays["ids"].size != key["rollouts"]:
                arrays = None  # rows committed out of id order, or deletions: start over
    if arrays is None:
        arrays = _read(run.id, component_ids, expected=key["rollouts"])
    if arrays["ids"].size == key["rollouts"]:  # a batch committed while we read: do not cache a mismatch
        _cache_write(run.id, key, arrays)
    return arrays


def component_infos(run: Run, comps: list[RewardComponent]) -> list[dg.ComponentInfo]:
    weights = run_weights(run, comps)
    return [dg.ComponentInfo(c.name, float(w), c.kind, c.min_value, c.max_value) for c, w in zip(comps, weights)]


def warm_run_cache(run_id: int) -> int:
    """Bring the run's array cache up to date (a worker can call this when a run finishes, so the first
    ablation of a large run does not pay the full database read). Returns the number of rollouts."""
    run = Run.objects.filter(id=run_id).first()
    return 0 if run is None else load_run_arrays(run).n


def load_run_arrays(run: Run, *, step_min: int | None = None) -> dg.RunArrays:
    """Every rollout of the run (from `step_min` on) as arrays, components in environment order."""
    comps = run_components(run)
    ids = [c.id for c in comps]
    if step_min is None:
        a = _full_arrays(run, ids)
    else:
        hit = _cache_read(run.id)
        if hit is not None and hit[0] == _shape_key(run, ids):
            keep = hit[1]["steps"] >= step_min
            a = {k: v[keep] for k, v in hit[1].items()}
        else:
            a = _read(run.id, ids, step_min=step_min)
    return dg.RunArrays(components=component_infos(run, comps), matrix=a["matrix"], group_ids=a["group_ids"],
                        steps=a["steps"], lengths=a["lengths"], rollout_ids=a["ids"])


def window_start(run: Run, window: int | None, max_rollouts: int | None = None) -> int | None:
    """The first step of the last `window` steps that have groups (None: from the start), shortened so
    that the window holds at most `max_rollouts` rollouts (never fewer than one step)."""
    if window is None and max_rollouts is None:
        return None
    per_step = (Group.objects.filter(run=run).values("step").annotate(n=Sum("size")).order_by("-step")
                .values_list("step", "n"))
    if window is not None:
        per_step = per_step[:window]
    first, total, rows = None, 0, list(per_step)
    for step, n in rows:
        if first is not None and max_rollouts is not None and total + (n or 0) > max_rollouts:
            return first
        first, total = step, total + (n or 0)
    return first if window is not None and len(rows) == window else None


# ------------------------------------------------------------------------------------------ diagnostics


def run_settings(run: Run) -> abl.Baseline:
    settings = run.advantage_settings()  # the trainer's own, recorded on the run
    return abl.Baseline(scale_rewards=settings["scale_rewards"], aggregation=settings["aggregation"],
                        eps=settings["advantage_epsilon"])


def _fingerprint(run: Run, *parts: Any) -> str:
    """Changes whenever the run gains groups or its weights/settings change: the cache key."""
    g = Group.objects.filter(run=run).aggregate(n=Count("id"), last=Max("id"))
    m = StepMetric.objects.filter(run=run).aggregate(n=Count("id"), last=Max("step"))
    # created_at: the cache is shared and outlives a database (a reset, a test session): run ids repeat.
    raw = json.dumps([run.id, run.created_at, g, m, run.config or {}, run.reward_settings or {}, *parts],
                     sort_keys=True, default=str)
    return hashlib.sha1(raw.encode()).hexdigest()


def _metrics(run: Run) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    keys = Q()
    for key in dg.UNSTABLE_KEYS:
        keys |= Q(name=key) | Q(name__startswith=f"{key}/") | Q(name=f"train/{key}") | Q(
            name__startswith=f"train/{key}/")
    rows = StepMetric.objects.filter(run=run).filter(keys).order_by("name", "step").values_list("name", "step", "value")
    out: dict[str, tuple[list[int], list[float]]] = {}
    for name, step, value in rows:
        s, v = out.setdefault(name, ([], []))
        s.append(step)
        v.append(math.nan if value is None else value)
    return {k: (np.array(s), np.array(v, dtype=np.float64)) for k, (s, v) in out.items()}


def _providers(run: Run, providers: list[Callable[[Run], Iterable[int]]]) -> Callable[[], Iterable[int]] | None:
    if not providers:
        return None
    return lambda: [rid for p in providers for rid in p(run)]


def diagnose_run(run: Run, window: int | None = DEFAULT_WINDOW,
                 max_rollouts: int | None = MAX_WINDOW_ROLLOUTS) -> dict[str, Any]:
    """The diagnosis of the run's last `window` steps (None: all) as JSON, cached until the run changes."""
    key = f"diag:{_fingerprint(run, window, max_rollouts, len(BAD_CASE_PROVIDERS))}"
    hit = cache.get(key)
    if hit is not None:
        return hit
    t0 = time.perf_counter()
    data = load_run_arrays(run, step_min=window_start(run, window, max_rollouts))
    t1 = time.perf_counter()
    d = dg.diagnose(data, aggregation=run_settings(run).aggregation, metrics=_metrics(run),
                    bad_case_ids=_providers(run, BAD_CASE_PROVIDERS),
                    annotated_ids=_providers(run, ANNOTATED_PROVIDERS))
    out = d.as_dict()
    out["window"] = window
    out["timing"] = {"read_s": round(t1 - t0, 4), "compute_s": round(time.perf_counter() - t1, 4)}
    cache.set(key, out, CACHE_SECONDS)
    return out


def slot_summary(run: Run) -> dict[str, Any]:
    """What the run dashboard shows: a health verdict, each component's share of the advantage and its
    zero-std fraction, and the top findings. Cached per run for SLOT_SECONDS (a live run's dashboard
    polls; the slot may lag instead of recomputing each time)."""
    from webapp.diagnostics.links import with_links

    key = f"diag-slot:{run.id}"
    hit = cache.get(key)
    if hit is not None:
        return hit
    try:
        d = diagnose_run(run, SLOT_WINDOW, SLOT_MAX_ROLLOUTS)
    except Exception:  # the dashboard must render even if a diagnosis fails; the full page shows the error
        log.exception("diagnostics summary failed for run %s", run.id)
        return {"error": "The diagnosis failed; open the diagnostics page for details."}
    h = d["health"]
    findings = with_links(run.id, d["findings"])
    severities = {f["severity"] for f in findings}
    worst = "critical" if "critical" in severities else "warning" if severities else "healthy"
    out = {
        "status": d.get("status") or worst,  # "not_enough_data": too few groups to judge (first steps, bad input)
        "note": d.get("note"),
        "n_rollouts": h["n_rollouts"], "step_min": h["step_min"], "step_max": h["step_max"],
        "components": [{k: c[k] for k in ("name", "kind", "weight", "share", "zero_std_frac", "at_max", "at_min")}
                       for c in h["components"]],
        "reward_zero_std_frac": h["reward_zero_std_frac"],
        "findings": findings[:3], "n_findings": len(findings),
    }
    cache.set(key, out, SLOT_SECONDS)
    return out


def step_aggregates(run: Run) -> dict[str, Any]:
    """Per step and component, from the stored GroupComponentStat rows (one SQL aggregate, whole run):
    mean, mean within-group std, fraction of zero-std groups; and the aggregate reward per step.
    Cached until the run gains groups."""
    key = f"diag-steps:{_fingerprint(run)}"
    hit = cache.get(key)
    if hit is None:
        hit = _step_aggregates(run)
        cache.set(key, hit, CACHE_SECONDS)
    return hit


def _step_aggregates(run: Run) -> dict[str, Any]:
    rows = (GroupComponentStat.objects.filter(run=run).values("step", "component_id")
            .annotate(groups=Count("id"), zero=Count("id", filter=Q(zero_std=True)), mean=Avg("mean"),
                      std=Avg("std")).order_by("step"))
    names = dict(RewardComponent.objects.filter(environment_id=run.environment_id).values_list("id", "name"))
    steps = sorted({r["step"] for r in rows})
    pos = {s: i for i, s in enumerate(steps)}
    series = {n: {"mean": [None] * len(steps), "std": [None] * len(steps), "zero_std_frac": [None] * len(steps)}
              for n in names.values()}
    for r in rows:
        s = series.get(names.get(r["component_id"], ""))
        if s is None:
            continue
        i = pos[r["step"]]
        s["mean"][i], s["std"][i] = r["mean"], r["std"]
        s["zero_std_frac"][i] = (r["zero"] or 0) / r["groups"] if r["groups"] else None
    reward = dict(Group.objects.filter(run=run).values("step").annotate(m=Avg("reward_mean")).values_list("step", "m"))
    zero = (Group.objects.filter(run=run).values("step")
            .annotate(n=Count("id"), z=Count("id", filter=Q(zero_std=True))).values_list("step", "n", "z"))
    zero_frac = {s: z / n for s, n, z in zero if n}
    return {"steps": steps, "components": series, "reward_mean": [reward.get(s) for s in steps],
            "reward_zero_std_frac": [zero_frac.get(s) for s in steps]}


# ------------------------------------------------------------------------------------------ ablations


class SpecError(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        self.message = message
        super().__init__(f"{field_name}: {message}")


def parse_spec(raw: Any, run: Run, comps: list[RewardComponent] | None = None) -> abl.AblationSpec:
    """Validate an ablation spec (API JSON or the page's form, turned into the same dict). Raises
    SpecError naming the field."""
    comps = run_components(run) if comps is None else comps
    names = [c.name for c in comps]
    base = run_settings(run)
    if not isinstance(raw, dict):
        raise SpecError("spec", "must be an object with drop, weights, scale_rewards, aggregation")
    extra = set(raw) - {"drop", "weights", "scale_rewards", "aggregation"}
    if extra:
        raise SpecError(f"spec.{sorted(extra)[0]}", "unknown key; expected drop, weights, scale_rewards, aggregation")
    # Absent or null means "as the run"; any other value must have the right type ({} is not a default).
    drop = [] if raw.get("drop") is None else raw["drop"]
    if not isinstance(drop, list) or not all(isinstance(d, str) for d in drop):
        raise SpecError("spec.drop", "must be a list of component names")
    for d in drop:
        if d not in names:
            raise SpecError("spec.drop", f"unknown component {d[:80]!r} (this run has: {', '.join(names)})")
    if names and len(set(drop)) == len(names):
        raise SpecError("spec.drop", "cannot drop every component: nothing would be left to reward")
    weights = {} if raw.get("weights") is None else raw["weights"]
    if not isinstance(weights, dict):
        raise SpecError("spec.weights", "must be an object of component name -> number")
    clean: dict[str, float] = {}
    for name, w in weights.items():
        if name not in names:
            raise SpecError(f"spec.weights.{str(name)[:80]}", f"unknown component (this run has: {', '.join(names)})")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise SpecError(f"spec.weights.{name}", "must be a finite number")
        clean[name] = float(w)
    scale = base.scale_rewards if raw.get("scale_rewards") is None else raw["scale_rewards"]
    if not isinstance(scale, str) or scale not in SCALES:
        raise SpecError("spec.scale_rewards", f"must be one of {', '.join(SCALES)}")
    agg = base.aggregation if raw.get("aggregation") is None else raw["aggregation"]
    if not isinstance(agg, str) or agg not in AGGREGATIONS:
        raise SpecError("spec.aggregation", f"must be one of {', '.join(AGGREGATIONS)}")
    return abl.AblationSpec(drop=tuple(dict.fromkeys(drop)), weights=clean, scale_rewards=scale, aggregation=agg)


def run_ablation(run: Run, spec: abl.AblationSpec, data: dg.RunArrays | None = None) -> dict[str, Any]:
    """Recompute every group's advantages under `spec` over the stored rollouts, end to end (read + math)."""
    t0 = time.perf_counter()
    data = load_run_arrays(run) if data is None else data
    t1 = time.perf_counter()
    out = abl.ablate(data, spec, run_settings(run))
    out["spec"] = spec.as_dict()
    out["baseline"] = {"weights": {c.name: c.weight for c in data.components}, **vars(run_settings(run))}
    out["timing"] = {"read_s": round(t1 - t0, 4), "compute_s": round(time.perf_counter() - t1, 4)}
    return out


def default_name(spec: abl.AblationSpec, run: Run) -> str:
    base = run_settings(run)
    parts = [f"drop {', '.join(spec.drop)}"] if spec.drop else []
    parts += [f"{k}={v:g}" for k, v in spec.weights.items()]
    if spec.scale_rewards != base.scale_rewards:
        parts.append(f"scale={spec.scale_rewards}")
    if spec.aggregation != base.aggregation:
        parts.append(spec.aggregation)
    return ("; ".join(parts) or "baseline")[:200]


@dataclass
class Launch:
    twin: Run
    enqueued: bool
    message: str


def twin_config(run: Run, **changes: Any) -> dict[str, Any]:
    """A twin run's job config: the run's own config (its start point: base model, steps, learning rate...)
    with the run's own weights by component name, then `changes`. Shared by ablation and replay twins."""
    comps = run_components(run)
    weights = {c.name: float(w) for c, w in zip(comps, run_weights(run, comps))}
    return {**(run.config or {}), "reward_weights": weights, **changes}


def launch_twin(ablation: Any, user: Any) -> Launch:
    """A twin GRPO run with the ablation's reward, from the same start as the run (same config and base
    model), recorded as the run's child. Enqueued when the workers' launcher exists."""
    from webapp.rollouts.services import create_run

    run: Run = ablation.run
    spec = abl.AblationSpec(drop=tuple(ablation.spec.get("drop", [])), weights=ablation.spec.get("weights", {}),
                           scale_rewards=ablation.spec["scale_rewards"], aggregation=ablation.spec["aggregation"])
    weights = {name: 0.0 if name in spec.drop else float(spec.weights.get(name, w))
               for name, w in twin_config(run)["reward_weights"].items()}
    config = twin_config(run, reward_weights=weights, ablation_of=run.id, ablation_id=ablation.id,
                         dropped_components=list(spec.drop), scale_rewards=spec.scale_rewards,
                         multi_objective_aggregation=spec.aggregation)
    twin = create_run(name=f"{run.name} / ablation: {ablation.name}"[:200], kind=Run.Kind.GRPO,
                      environment=run.environment, config=config, owner=user, base_model=run.base_model, parent=run)
    type(ablation).objects.filter(id=ablation.id).update(twin=twin)
    try:
        from workers.launch import enqueue_run  # built by the jobs engineer; absent until then
    except ImportError:
        return Launch(twin, False, "The twin run is queued; no worker launcher is installed yet, so it will start "
                                   "when one picks queued runs up.")
    enqueue_run(twin.id)
    return Launch(twin, True, "The twin run is queued for a GPU worker.")


def overlay_series(runs: list[Run]) -> list[dict[str, Any]]:
    """Reward mean per step and per-component means per step for each run (from stored aggregates)."""
    out = []
    for run in runs:
        agg = step_aggregates(run)
        metric = dict(StepMetric.objects.filter(run=run, name="reward").values_list("step", "value"))
        out.append({"run": run, "steps": agg["steps"], "reward_mean": agg["reward_mean"],
                    "components": {n: s["mean"] for n, s in agg["components"].items()},
                    "logged_reward": sorted(metric.items())})
    return out
