"""Where the bytes go: realistic rollouts stored through the ingestion service, then bytes per
rollout of every table (heap, TOAST) and every index, against the same group records as JSONL
compressed with zstd level 3 (issue 30's yardstick: at most 2x, all indexes included). Also the
WAL written per rollout and the ingest rate (one session), for docs/architecture.md's arithmetic.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/rd_bench_storage python bench/storage.py
    ... bench/storage.py --rollouts 50000

Use a database of its own: sizes are of whole tables, divided by the rollouts they hold.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import ROLLOUT_TABLES, load_line, report, setup_django  # noqa: E402

SIZES_SQL = """
SELECT c.relname, 'heap', pg_relation_size(c.oid),
       coalesce(pg_total_relation_size(c.reltoastrelid), 0)
FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE 'rollouts\\_%%'
UNION ALL
SELECT t.relname, i.relname, pg_relation_size(i.oid), 0
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
WHERE t.relname LIKE 'rollouts\\_%%'
"""


def zstd_jsonl(groups: list[dict]) -> tuple[int, int]:
    import pyarrow as pa

    raw = "".join(json.dumps(g, ensure_ascii=False) + "\n" for g in groups).encode()
    codec = pa.Codec("zstd", compression_level=3)
    return len(raw), len(codec.compress(raw, asbytes=True))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, default=20_000)
    p.add_argument(
        "--non-ascii",
        type=int,
        default=0,
        help="tokens with non-ASCII characters added to each rollout (bench.ingest.with_non_ascii)",
    )
    args = p.parse_args(argv)
    setup_django()
    from django.db import connection

    from bench.ingest import GROUPS_PER_BATCH, make_realistic_groups, new_run, with_non_ascii
    from webapp.rollouts.ingest import ingest_groups

    groups = make_realistic_groups(args.rollouts, seed=11)
    if args.non_ascii:
        groups = with_non_ascii(groups, args.non_ascii)
        print(f"{args.non_ascii} non-ASCII tokens added to each rollout's last message")
    n = sum(len(g["rollouts"]) for g in groups)
    run = new_run(f"bench-storage-{time.time():.0f}")
    with connection.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()")
        lsn0 = cur.fetchone()[0]
    t0 = time.perf_counter()
    for i in range(0, len(groups), GROUPS_PER_BATCH):
        ingest_groups(run, {"groups": groups[i : i + GROUPS_PER_BATCH]})
    dt = time.perf_counter() - t0
    with connection.cursor() as cur:
        cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [lsn0])
        wal = int(cur.fetchone()[0])
        for table in (*ROLLOUT_TABLES, "rollouts_searchword"):
            cur.execute(f"VACUUM ANALYZE {table}")
        cur.execute("SELECT count(*) FROM rollouts_rollout")
        stored = cur.fetchone()[0]
        cur.execute(SIZES_SQL)
        rows = cur.fetchall()
    raw, z = zstd_jsonl(groups)
    total = sum(b + t for *_, b, t in rows)
    report(
        f"{n:,} realistic rollouts ingested in {dt:.1f} s ({n / dt:,.0f}/s, one session); "
        f"WAL {wal / n / 1024:.1f} KiB per rollout"
    )
    print(f"database holds {stored:,} rollouts; per rollout:")
    for table, kind, b, toast in sorted(rows, key=lambda r: -(r[2] + r[3])):
        if b + toast < total / 500:
            continue  # under 0.2% of the total
        what = f"{table} ({'table' if kind == 'heap' else 'index ' + kind})"
        extra = f" (of which TOAST {toast / stored:,.0f} B)" if toast else ""
        print(f"  {what:<66} {(b + toast) / stored:>9,.0f} B{extra}")
    print(f"  {'all tables and indexes':<66} {total / stored:>9,.0f} B")
    print(
        f"JSONL of the same groups: {raw / n:,.0f} B raw, {z / n:,.0f} B zstd-3 per rollout; "
        f"database / zstd-3 = {total / stored / (z / n):.2f} (target <= 2)"
    )
    print(load_line())


if __name__ == "__main__":
    main()
