"""tsvector GIN vs pg_trgm GIN for whole-rollout search, measured on realistic search documents.

    export DATABASE_URL=postgres://postgres@127.0.0.1:5432/rd_bench
    .venv/bin/python bench/search_compare.py --rows 20000

Builds a scratch table (id, score, doc) of realistic rollouts' search documents
(bench/realistic.py's generator, webapp/rollouts/text.py's document builder) with a btree on score
(the explorer's "sorted by a component" path), then for each index kind: build time, index size, and
the median time of a rare word and a common word query, first page of 50 sorted by score, plus the
plan the planner chose. Same table, same process, same queries: only the index differs. The scratch
table is dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.harness import load_line, progress, report, require_postgres  # noqa: E402
from bench.realistic import COMMON_WORD, RARE_WORDS, G, Vocabulary, make_step  # noqa: E402

KINDS = {
    "tsvector GIN (expression)": (
        "CREATE INDEX search_cmp_idx ON search_cmp USING gin (to_tsvector('simple', doc))",
        "to_tsvector('simple', doc) @@ phraseto_tsquery('simple', %s)",
    ),
    "pg_trgm GIN (UPPER(doc) LIKE)": (
        "CREATE INDEX search_cmp_idx ON search_cmp USING gin (UPPER(doc) gin_trgm_ops)",
        "UPPER(doc) LIKE UPPER('%%' || %s || '%%')",
    ),
}


def fill(cur, rows: int) -> None:
    from webapp.rollouts.text import search_document

    cur.execute("DROP TABLE IF EXISTS search_cmp")
    cur.execute("CREATE TABLE search_cmp (id bigint PRIMARY KEY, score float8, doc text)")
    rng, vocab = np.random.default_rng(3), Vocabulary(np.random.default_rng(7))
    n = 0
    with (
        progress(rows, "documents") as bar,
        cur.copy("COPY search_cmp (id, score, doc) FROM STDIN") as cp,
    ):
        while n < rows:
            for g in make_step("realistic", n // 1000, 1000 // G, vocab, rng):
                for r in g["rollouts"]:
                    reasons = [v["reason"] for v in r["rewards"].values() if isinstance(v, dict)]
                    doc = search_document("", g["prompt"], r["transcript"], reasons)
                    cp.write_row((n, float(rng.random()), doc))
                    n += 1
            bar.update(1000)
    cur.execute("CREATE INDEX search_cmp_score ON search_cmp (score, id)")
    cur.execute("VACUUM ANALYZE search_cmp")


def timed(cur, sql: str, params: list, repeat: int) -> tuple[float, int]:
    times, n = [], 0
    for _ in range(repeat + 1):
        t = time.perf_counter()
        cur.execute(sql, params)
        n = len(cur.fetchall())
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times[1:]), n


def compare(rows: int, repeat: int) -> None:
    import django

    django.setup()
    from django.db import connection

    with connection.cursor() as dc:
        cur = dc.cursor
        cur.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        fill(cur, rows)
        cur.execute("SELECT pg_size_pretty(pg_table_size('search_cmp'))")
        print(f"\n{rows:,} documents, table {cur.fetchone()[0]}; median of {repeat}")
        rare = next(w for w, (rate, _) in RARE_WORDS.items() if rate * rows >= 5)
        for kind, (create, match) in KINDS.items():
            cur.execute("DROP INDEX IF EXISTS search_cmp_idx")
            t = time.perf_counter()
            cur.execute(create)
            build = time.perf_counter() - t
            cur.execute("ANALYZE search_cmp")
            cur.execute("SELECT pg_size_pretty(pg_relation_size('search_cmp_idx'))")
            print(f"\n{kind}: build {build:.1f} s, size {cur.fetchone()[0]}")
            for word in (rare, COMMON_WORD):
                page = (
                    f"SELECT id FROM search_cmp WHERE {match} ORDER BY score DESC, id DESC LIMIT 50"
                )
                count = f"SELECT id FROM search_cmp WHERE {match}"
                ms, _ = timed(cur, page, [word], repeat)
                cms, hits = timed(cur, count, [word], repeat)
                cur.execute("EXPLAIN " + page, [word])
                plan = " / ".join(r[0].strip().split("  (")[0] for r in cur.fetchall()[:3])
                report(
                    f"  {word!r:14} first page {ms:8.1f} ms | all {hits:,} hits {cms:8.1f} ms | "
                    f"plan: {plan}"
                )
        cur.execute("DROP TABLE search_cmp")
    print(load_line())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    require_postgres()
    compare(args.rows, args.repeat)


if __name__ == "__main__":
    main()
