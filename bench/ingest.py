"""Ingestion throughput on Postgres, as ratios measured in one run (the machines are noisy).

    export DATABASE_URL=postgres://postgres@127.0.0.1:5432/rd_bench
    .venv/bin/python bench/ingest.py [--rollouts 200000]
    .venv/bin/python -m bench.ingest --realistic --rollouts 4000  # multi-turn (bench/realistic.py)

(a) the service (`ingest_groups`: validation, stats, advantages, previews, search text, COPY)
    against a raw psycopg COPY of the same rows (previews and search text included, prebuilt)
    into the same tables, the floor (target ratio >= 0.5);
(b) the service against a per-object Django ORM save() loop on a 5,000-rollout sample (target
    >= 30x; one-line rollouts only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from bench.harness import (  # noqa: E402
    COMPONENT_NAMES,
    bench_run,
    load_line,
    ratio,
    report,
    require_postgres,
    track,
)
from training.records import GroupRecord, RolloutRecord, Score  # noqa: E402
from webapp.rollouts import packed, text  # noqa: E402
from webapp.rollouts.ingest import ingest_groups  # noqa: E402
from webapp.rollouts.models import Group, GroupComponentStat, RewardScore, Rollout  # noqa: E402

G = 8
NAMES = list(COMPONENT_NAMES)
K = len(NAMES)
GROUPS_PER_BATCH = 250


def make_groups(n_rollouts: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    n_groups = n_rollouts // G
    values = (
        rng.integers(0, 5, size=(n_groups, G, K)) / 4.0
    )  # quarter steps: many ties, some zero-std groups
    groups = []
    for gi in range(n_groups):
        rollouts = [
            RolloutRecord(
                index=i,
                completion=f'[{{"action": "create_shape", "id": "n{i}", "x": {gi % 700}}}]',
                rewards={NAMES[j]: Score(float(values[gi, i, j]), "ok") for j in range(K)},
                length=20 + i,
            )
            for i in range(G)
        ]
        prompt = f"Draw diagram number {gi % 50} with a few boxes and arrows."
        group = GroupRecord(
            step=gi // 50, key=f"prompt-{gi % 50}", prompt=prompt, rollouts=rollouts
        )
        groups.append(group.to_json())
    return groups


def make_realistic_groups(n_rollouts: int, seed: int) -> list[dict]:
    """bench/realistic.py's multi-turn rollouts, scored on this bench's components."""
    from bench.realistic import Vocabulary, make_step

    rng, vocab = np.random.default_rng(seed), Vocabulary(np.random.default_rng(7))
    groups = []
    for step in range(max(1, n_rollouts // (G * 50))):
        for g in make_step("realistic", step, 50, vocab, rng):
            rollouts = []
            for r in g["rollouts"]:
                values = rng.integers(0, 5, K) / 4.0
                scores = {NAMES[j]: Score(float(values[j]), "ok") for j in range(K)}
                rollouts.append(replace(RolloutRecord.from_json(r), rewards=scores))
            groups.append({**g, "rollouts": [r.to_json() for r in rollouts]})
    return groups


def _transcript(r: dict) -> list[dict]:
    return r.get("transcript") or [{"role": "assistant", "content": r["completion"]}]


def new_run(name: str):
    return bench_run(name, "bench-4c", kind="import")


def bench_service(groups: list[dict]) -> float:
    run = new_run(f"bench-service-{time.time()}")
    t0 = time.perf_counter()
    for i in track(range(0, len(groups), GROUPS_PER_BATCH), "service", "batch"):
        ingest_groups(run, {"groups": groups[i : i + GROUPS_PER_BATCH]})
    return time.perf_counter() - t0


def prepare_rows(groups: list[dict], run) -> list[tuple]:
    """The rows the service would write for `groups` in `run`, prebuilt as tuples per batch of
    GROUPS_PER_BATCH groups (stats, packed scores, previews, search text and words included)."""
    comps = {c.name: c.id for c in run.environment.components.all()}
    prepared = []
    for i in track(range(0, len(groups), GROUPS_PER_BATCH), "raw COPY (prebuilding rows)", "batch"):
        batch = groups[i : i + GROUPS_PER_BATCH]
        with connection.cursor() as dc:
            cur = dc.cursor
            cur.execute(
                "SELECT nextval(pg_get_serial_sequence('rollouts_group','id')) FROM "
                "generate_series(1,%s)",
                [len(batch)],
            )
            gids = [r[0] for r in cur.fetchall()]
            cur.execute(
                "SELECT nextval(pg_get_serial_sequence('rollouts_rollout','id')) FROM "
                "generate_series(1,%s)",
                [len(batch) * G],
            )
            rids = [r[0] for r in cur.fetchall()]
        g_rows, r_rows, s_rows, st_rows, vocab = [], [], [], [], set()
        k = 0
        header = packed.header([comps[n] for n in NAMES])
        for gi, (gid, g) in enumerate(zip(gids, batch, strict=True)):
            m = np.array([[r["rewards"][n]["value"] for n in NAMES] for r in g["rollouts"]])
            tot = m.sum(axis=1)
            lengths = np.array([r["length"] for r in g["rollouts"]], dtype=np.float64)
            blob = packed.pack_groups(np.array(rids[gi * G : (gi + 1) * G]), lengths, m, [G])[0]
            prompt_text = text_of(g["prompt"])
            g_rows.append(
                (
                    gid,
                    run.id,
                    g["step"],
                    g["key"],
                    json.dumps(g["prompt"]),
                    prompt_text,
                    "train",
                    G,
                    float(tot.mean()),
                    float(tot.std(ddof=1)),
                    False,
                    False,
                    blob,
                    header,
                )
            )
            for r in g["rollouts"]:
                rid = rids[k]
                k += 1
                tr = _transcript(r)
                sm = text.summarize(tr, g["prompt"])
                doc = text.search_document(prompt_text, g["prompt"], tr, ["ok"] * K)
                words = text.search_words(doc)
                vocab.update(words or ())
                r_rows.append(
                    (
                        rid,
                        gid,
                        run.id,
                        g["step"],
                        "train",
                        r["index"],
                        json.dumps(tr),
                        tr[-1]["content"],
                        0.0,
                        0.0,
                        r["length"],
                        False,
                        "",
                        "",
                        json.dumps(r["state"]) if r.get("state") else None,
                        sm.head,
                        sm.tail,
                        sm.turns,
                        sm.tool_calls,
                        sm.chars,
                        doc,
                        text.words_tsvector(run.id, words),
                    )
                )
                for n in NAMES:
                    s_rows.append(
                        (rid, comps[n], run.id, g["step"], r["rewards"][n]["value"], "ok")
                    )
            for j, n in enumerate(NAMES):
                st_rows.append(
                    (
                        gid,
                        comps[n],
                        run.id,
                        g["step"],
                        G,
                        float(m[:, j].mean()),
                        float(m[:, j].std(ddof=1)),
                        float(m[:, j].min()),
                        float(m[:, j].max()),
                        False,
                    )
                )
        prepared.append((g_rows, r_rows, s_rows, st_rows, sorted(vocab)))
    return prepared


COPY_TABLES = (
    (
        "rollouts_group",
        "id, run_id, step, key, prompt, prompt_text, split, size, reward_mean, "
        "reward_std, zero_std, all_unscorable, packed_scores, packed_components",
    ),
    (
        "rollouts_rollout",
        "id, group_id, run_id, step, split, index, transcript, completion, "
        "reward, advantage, length, truncated, finish_reason, parse_error, state, preview_head, "
        "preview_tail, n_turns, n_tool_calls, text_chars, search_text, search_words",
    ),
    ("rollouts_rewardscore", "rollout_id, component_id, run_id, step, value, reason"),
    (
        "rollouts_groupcomponentstat",
        "group_id, component_id, run_id, step, count, mean, std, min, max, zero_std",
    ),
)
# The search indexes a choice may build on the scratch copy of rollouts_rollout.
SEARCH_INDEXES = {
    "words": "USING gin (search_words)",  # migration 0010
    "trigram": "USING gin (run_id, UPPER(search_text) gin_trgm_ops)",  # 0008, dropped by 0014
    "non-ASCII trigram": "USING gin (run_id, rd_search_nonascii(search_text) gin_trgm_ops)",  # 0014
}


def copy_rows(
    prepared: list[tuple], run_id: int, schema: str = "public", desc: str = "raw COPY"
) -> float:
    """COPY prebuilt rows (prepare_rows) batch by batch, one transaction a batch, into the
    project's tables or their copies in `schema`; the seconds the COPYs and commits took."""
    t0 = time.perf_counter()  # only the COPY and the commit are timed: the floor
    for tables in track(prepared, desc, "batch"):
        with transaction.atomic(), connection.cursor() as dc:
            for (table, columns), rows in zip(COPY_TABLES, tables[:4], strict=True):
                with dc.cursor.copy(f"COPY {schema}.{table} ({columns}) FROM STDIN") as cp:
                    for row in rows:
                        cp.write_row(row)
            dc.execute(  # the run's vocabulary, as the service adds it (prebuilt word list)
                f"INSERT INTO {schema}.rollouts_searchword (run_id, word) SELECT %s, w "
                "FROM unnest(%s::text[]) AS w ORDER BY w ON CONFLICT DO NOTHING",
                [run_id, tables[4]],
            )
    return time.perf_counter() - t0


def bench_raw_copy(groups: list[dict]) -> float:
    """The floor: the same rows, prebuilt as tuples, COPY'd in batches of the same size into the
    project's tables (every index on)."""
    run = new_run(f"bench-copy-{time.time()}")
    return copy_rows(prepare_rows(groups, run), run.id)


@contextlib.contextmanager
def scratch_tables(search: tuple[str, ...], gin: dict[str, str] | None = None, lz4: bool = False):
    """Copies of the ingested tables (columns, storage, compression, indexes; no foreign keys) in
    a scratch schema, the rollouts' search indexes replaced by those named in `search`
    (SEARCH_INDEXES keys), with `gin` storage parameters (e.g. {"gin_pending_list_limit":
    "262144"}); `lz4`: the transcript and search text compressed with lz4 instead of pglz.
    Yields the schema and those indexes' names; dropped afterwards."""
    schema = "bench_scratch"
    tables = [t for t, _ in COPY_TABLES] + ["rollouts_searchword"]
    made: list[str] = []
    with connection.cursor() as cur:
        cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        cur.execute(f"CREATE SCHEMA {schema}")
        for t in tables:
            cur.execute(f"CREATE TABLE {schema}.{t} (LIKE public.{t} INCLUDING ALL)")
        cur.execute(
            "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x "
            "JOIN pg_class c ON c.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = 'rollouts_rollout'",
            [schema],
        )
        for index, definition in cur.fetchall():
            if "USING gin" in definition:  # LIKE names the copies after their columns
                cur.execute(f"DROP INDEX {schema}.{index}")
        if lz4:
            for column in ("transcript", "search_text"):
                cur.execute(
                    f"ALTER TABLE {schema}.rollouts_rollout ALTER COLUMN {column} "
                    "SET COMPRESSION lz4"
                )
        with_ = f" WITH ({', '.join(f'{k} = {v}' for k, v in gin.items())})" if gin else ""
        for k, kind in enumerate(search):
            made.append(f"{schema}.search_{k}")
            table = f"{schema}.rollouts_rollout"
            cur.execute(f"CREATE INDEX search_{k} ON {table} {SEARCH_INDEXES[kind]}{with_}")
    try:
        yield schema, made
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


INDEX_CHOICES = {
    # name: (search indexes, GIN storage parameters, pending list cleaned after the COPY, lz4)
    "before 0014: words + trigram": (("words", "trigram"), None, False, False),
    "now: words + non-ASCII trigram": (("words", "non-ASCII trigram"), None, False, False),
    "no search index (floor 2)": ((), None, False, False),
    "words only": (("words",), None, False, False),
    "before, pending list 256 MB": (
        ("words", "trigram"),
        {"gin_pending_list_limit": "262144"},
        True,
        False,
    ),
    "now, text under lz4": (("words", "non-ASCII trigram"), None, False, True),
    "floor 2, text under lz4": ((), None, False, True),
}


NON_ASCII = ["naïve", "—", "“quoted”", "café", "…", "→", "✓", "Straße", "日本語", "señal"]


def with_non_ascii(groups: list[dict], k: int, seed: int = 0) -> list[dict]:
    """The groups with `k` tokens holding non-ASCII characters (NON_ASCII: the dashes, quotes
    and accents of real model text) appended to each rollout's last message."""
    rng = np.random.default_rng(seed)
    out = []
    for g in groups:
        rollouts = []
        for r in g["rollouts"]:
            tr = [dict(m) for m in _transcript(r)]
            extra = " ".join(NON_ASCII[i] for i in rng.integers(0, len(NON_ASCII), k))
            tr[-1]["content"] = f"{tr[-1].get('content') or ''} {extra}"
            rollouts.append({**r, "transcript": tr})
        out.append({**g, "rollouts": rollouts})
    return out


def bench_index_choices(groups: list[dict], rounds: int) -> None:
    """Item 6 of issue 30: what the search indexes cost the write path. The same prebuilt rows
    COPY'd into scratch copies of the tables under each choice, the choices alternated round by
    round (the machine is noisy); a pending-list choice also reports its cleanup, timed apart."""
    run = new_run(f"bench-copy-{time.time()}")
    prepared = prepare_rows(groups, run)
    n = len(groups) * G
    times: dict[str, list[float]] = {name: [] for name in INDEX_CHOICES}
    cleanup: dict[str, list[float]] = {name: [] for name in INDEX_CHOICES}
    for _ in range(rounds):
        for name, (search, gin, clean, lz4) in INDEX_CHOICES.items():
            with scratch_tables(search, gin, lz4) as (schema, kept):
                times[name].append(copy_rows(prepared, run.id, schema, name))
                if clean:
                    t0 = time.perf_counter()
                    with connection.cursor() as cur:
                        for index in kept:
                            cur.execute("SELECT gin_clean_pending_list(%s::regclass)", [index])
                    cleanup[name].append(time.perf_counter() - t0)
    base = n / float(np.median(times["before 0014: words + trigram"]))
    print(f"index choices: {n:,} realistic rollouts, median of {rounds} alternated rounds")
    for name in INDEX_CHOICES:
        rate = n / float(np.median(times[name]))
        line = f"  {name:<32} {rate:>6,.0f} rollouts/s  {ratio(rate, base)} of before 0014"
        if cleanup[name]:
            total = n / (float(np.median(times[name])) + float(np.median(cleanup[name])))
            line += f"; with its cleanup {total:,.0f}/s ({ratio(total, base)})"
        report(line)
    print(load_line())
    from webapp.runs.models import Run

    Run.objects.filter(name__startswith="bench-copy-").delete()


def text_of(prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', '')}: {m.get('content') or ''}" for m in prompt)


def bench_orm_loop(groups: list[dict], one_transaction: bool) -> float:
    """Naive code: save() per object in autocommit; or the same loop inside one transaction."""
    run = new_run(f"bench-orm-{time.time()}")
    comps = {c.name: c for c in run.environment.components.all()}
    t0 = time.perf_counter()
    with transaction.atomic() if one_transaction else contextlib.nullcontext():
        for g in track(groups, "ORM save()", "group"):
            grp = Group(
                run=run,
                step=g["step"],
                key=g["key"],
                prompt=g["prompt"],
                prompt_text=g["prompt"],
                size=G,
                packed_scores=b"",
            )  # naive code: the score blob is not even built
            grp.save()
            m = np.array([[r["rewards"][n]["value"] for n in NAMES] for r in g["rollouts"]])
            for r in g["rollouts"]:
                ro = Rollout(
                    group=grp,
                    run=run,
                    step=g["step"],
                    index=r["index"],
                    transcript=[{"role": "assistant", "content": r["completion"]}],
                    completion=r["completion"],
                    length=r["length"],
                )
                ro.save()
                for n in NAMES:
                    RewardScore(
                        rollout=ro,
                        component=comps[n],
                        run=run,
                        step=g["step"],
                        value=r["rewards"][n]["value"],
                        reason="ok",
                    ).save()
            for j, n in enumerate(NAMES):
                GroupComponentStat(
                    group=grp,
                    component=comps[n],
                    run=run,
                    step=g["step"],
                    count=G,
                    mean=float(m[:, j].mean()),
                    std=float(m[:, j].std(ddof=1)),
                ).save()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200_000)
    parser.add_argument("--orm-sample", type=int, default=5_000)
    parser.add_argument(
        "--realistic", action="store_true", help="multi-turn transcripts (no ORM loop)"
    )
    parser.add_argument(
        "--index-choices",
        action="store_true",
        help="with --realistic: the COPY floor under each search-index choice (issue 30, 6)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternated rounds of --index-choices"
    )
    parser.add_argument(
        "--non-ascii",
        type=int,
        default=0,
        help="with --index-choices: tokens with non-ASCII characters added to each rollout",
    )
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/ingest.py measures the Postgres COPY path: set DATABASE_URL=postgres://...")
    require_postgres()  # creates the database when missing
    call_command("migrate", verbosity=0)
    if args.realistic and args.index_choices:
        groups = make_realistic_groups(args.rollouts, seed=0)
        if args.non_ascii:
            print(f"{args.non_ascii} non-ASCII tokens added to each rollout's last message")
            groups = with_non_ascii(groups, args.non_ascii)
        return bench_index_choices(groups, args.rounds)
    if args.realistic:
        return bench_realistic(args.rollouts)
    groups = make_groups(args.rollouts, seed=0)
    sample = make_groups(args.orm_sample, seed=1)
    n = len(groups) * G
    t_copy = bench_raw_copy(groups)
    t_service = bench_service(groups)
    t_orm = bench_orm_loop(sample, one_transaction=False)
    t_orm_tx = bench_orm_loop(sample, one_transaction=True)
    svc_rate, copy_rate, orm_rate = n / t_service, n / t_copy, len(sample) * G / t_orm
    orm_tx_rate = len(sample) * G / t_orm_tx
    print(f"rollouts: {n:,} (G={G}, {K} components, batches of {GROUPS_PER_BATCH} groups)")
    report(f"service   : {svc_rate:>10,.0f} rollouts/s ({t_service:.1f} s)")
    report(f"raw COPY  : {copy_rate:>10,.0f} rollouts/s ({t_copy:.1f} s)  floor")
    report(f"ORM save(): {orm_rate:>10,.0f} rollouts/s ({t_orm:.1f} s on {len(sample) * G:,})")
    print(f"ratio service / raw COPY  = {ratio(svc_rate, copy_rate)}  (target >= 0.5)")
    report(f"ORM save() in one transaction: {orm_tx_rate:>10,.0f} rollouts/s ({t_orm_tx:.1f} s)")
    print(f"ratio service / ORM loop  = {ratio(svc_rate, orm_rate, 1)} (target >= 30x)")
    print(f"ratio service / ORM loop in one transaction = {ratio(svc_rate, orm_tx_rate, 1)}")
    print(load_line())
    for run_name in ("bench-service-", "bench-copy-", "bench-orm-"):
        from webapp.runs.models import Run

        Run.objects.filter(name__startswith=run_name).delete()


def bench_realistic(n_rollouts: int) -> None:
    groups = make_realistic_groups(n_rollouts, seed=0)
    n = len(groups) * G
    t_copy = bench_raw_copy(groups)
    t_service = bench_service(groups)
    print(
        f"realistic rollouts: {n:,} (G={G}, {K} components, batches of {GROUPS_PER_BATCH} groups)"
    )
    report(f"service   : {n / t_service:>10,.0f} rollouts/s ({t_service:.1f} s)")
    report(
        f"raw COPY  : {n / t_copy:>10,.0f} rollouts/s ({t_copy:.1f} s)  floor: the same rows, "
        "prebuilt"
    )
    print(f"ratio service / raw COPY  = {ratio(t_copy, t_service)}  (target >= 0.5)")
    print(load_line())
    from webapp.runs.models import Run

    Run.objects.filter(name__startswith="bench-service-").delete()
    Run.objects.filter(name__startswith="bench-copy-").delete()


if __name__ == "__main__":
    main()
