"""Page latency at scale: seed N rollouts (G=8, 4 components, 500 steps) in Postgres through the one
ingestion service, then time the pages with Django's test client (median of repeated requests).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/rd_bench .venv/bin/python bench/pages.py
    ... bench/pages.py --rollouts 200000 --repeat 9 --explain

The seeded run is found again by name (bench-pages-<N>), so a rerun skips seeding; an interrupted
seed resumes at the first missing step (ingestion is idempotent on (step, key)). Targets: explorer
first page < 100 ms, dashboard < 300 ms. Page 500 is timed by keyset (the explorer's cursor) and by
OFFSET on the same ordering, in this run, and reported as a ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training.records import GroupRecord, RolloutRecord  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")


def production_like_env() -> None:
    """Production-like request path: no DEBUG query log, no HTTPS redirect for the test client.
    Called by main() only: importing this module (tests borrow its data shapes) changes nothing."""
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-not-for-production-use-0123456789")
    os.environ.setdefault("SECURE_SSL_REDIRECT", "0")
    os.environ.setdefault("DB_CONN_MAX_AGE", "60")  # persistent connections, as gunicorn would run


G = 8
STEPS = 500
BATCH_GROUPS = 250
COMPONENTS = [
    {"name": "correct", "weight": 1.0, "kind": "outcome", "min_value": 0.0, "max_value": 1.0},
    {"name": "format", "weight": 0.2, "kind": "behavioural", "min_value": 0.0, "max_value": 1.0},
    {"name": "coverage", "weight": 0.5, "kind": "process", "min_value": 0.0, "max_value": 1.0},
    {
        "name": "length_penalty",
        "weight": 0.1,
        "kind": "penalty",
        "min_value": -1.0,
        "max_value": 0.0,
    },
]
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "shape",
    "connect",
    "node",
    "edge",
    "label",
    "rect",
    "ellipse",
    "diamond",
    "canvas",
    "json",
    "list",
    "overlap",
    "inside",
    "start",
    "end",
    "deploy",
    "build",
    "test",
    "review",
    "merge",
    "ship",
]


def _require_postgres() -> None:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit(
            "DATABASE_URL: set it to a Postgres database (the benchmark measures Postgres plans)"
        )
    import psycopg

    base, _, name = url.rpartition("/")
    name = name.split("?")[0]
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def synthetic_step(step: int, groups_per_step: int, rng: Any) -> list[dict[str, Any]]:
    """One step of groups with random scores whose means drift upward over the run."""
    import numpy as np

    skill = 0.2 + 0.7 * step / max(STEPS - 1, 1)
    n = groups_per_step * G
    correct = (rng.random(n) < skill).astype(float)
    fmt = np.where(
        rng.random(n) < 0.9, 1.0, rng.choice([0.0, 0.5], n)
    )  # saturates early: many tied groups
    coverage = np.clip(rng.normal(skill, 0.2, n), 0, 1).round(3)
    penalty = np.where(rng.random(n) < 0.15, -rng.random(n).round(2), 0.0)
    words = rng.integers(0, len(WORDS), (n, 14))
    groups = []
    for g in range(groups_per_step):
        rollouts = []
        for i in range(G):
            k = g * G + i
            text = " ".join(WORDS[w] for w in words[k])
            rollouts.append(
                RolloutRecord(
                    index=i,
                    completion=f"[step {step}] {text}",
                    length=int(20 + words[k].sum() % 200),
                    rewards={
                        "correct": correct[k],
                        "format": fmt[k],
                        "coverage": coverage[k],
                        "length_penalty": penalty[k],
                    },
                )
            )
        group = GroupRecord(
            step=step,
            key=f"p{g:05d}",
            prompt=f"prompt {g} at step {step}",
            split="holdout" if g % 10 == 0 else "train",
            rollouts=rollouts,
        )
        groups.append(group.to_json())
    return groups


def seed(n_rollouts: int) -> Any:
    import numpy as np

    from bench.progress import progress
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.models import Group
    from webapp.rollouts.services import ensure_environment, get_or_create_run

    groups_per_step = max(1, n_rollouts // (G * STEPS))
    env = ensure_environment("bench-4c", COMPONENTS)
    name = f"bench-pages-{n_rollouts}"
    run, _ = get_or_create_run(
        name=name,
        kind="grpo",
        environment=env,
        config={"num_generations": G},
        status="running",
        base_model="bench/tiny",
    )
    done = set(Group.objects.filter(run=run).values_list("step", flat=True).distinct())
    todo = [s for s in range(STEPS) if s not in done]
    if not todo:
        from webapp.rollouts.models import StepStat
        from webapp.rollouts.services import recompute_run_stats

        if not StepStat.objects.filter(run=run).exists():  # seeded before StepStat existed
            print("building per-step statistics for the seeded run ...")
            recompute_run_stats(run)
        print(f"reusing seeded run {run.id} ({name})")
        return run
    rng = np.random.default_rng(len(done))
    per_batch = max(1, BATCH_GROUPS // groups_per_step)  # whole steps per batch, ~250 groups
    t0 = time.perf_counter()
    with progress(len(todo) * groups_per_step * G, "seeding") as bar:
        for i in range(0, len(todo), per_batch):
            steps = todo[i : i + per_batch]
            groups = [g for s in steps for g in synthetic_step(s, groups_per_step, rng)]
            ingest_groups(run, {"groups": groups})
            bar.update(len(groups) * G)
    dt = time.perf_counter() - t0
    print(
        f"seeded {len(todo) * groups_per_step * G:,} rollouts in {dt:.0f} s "
        f"({len(todo) * groups_per_step * G / dt:,.0f} rollouts/s)"
    )
    from django.db import connection

    with connection.cursor() as cur:  # fresh statistics, as autovacuum would eventually give
        for table in (
            "rollouts_group",
            "rollouts_rollout",
            "rollouts_rewardscore",
            "rollouts_groupcomponentstat",
            "rollouts_stepstat",
        ):
            cur.execute(f"VACUUM ANALYZE {table}")
    return run


def median_ms(fn: Callable[[], Any], repeat: int, warmup: int = 2) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--page", type=int, default=500, help="the deep page for keyset vs OFFSET")
    parser.add_argument(
        "--explain", action="store_true", help="print EXPLAIN ANALYZE of the key queries"
    )
    args = parser.parse_args(argv)
    _require_postgres()
    production_like_env()

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext  # EXPLAIN only: queries of direct calls

    call_command("migrate", verbosity=0)
    from webapp.accounts.roles import set_role
    from webapp.rollouts.models import Group, RewardComponent, RewardScore, Rollout
    from webapp.rollouts.queries import ExplorerQuery, _hydrate, encode_cursor, explore

    run = seed(args.rollouts)
    n = Rollout.objects.filter(run=run).count()
    user, _ = get_user_model().objects.get_or_create(username="bench-viewer")
    set_role(user, "viewer")
    client = Client()
    client.force_login(user)
    comp = RewardComponent.objects.get(environment=run.environment, name="coverage")

    limit = 50
    args.page = max(2, min(args.page, n // limit))  # a small quick run has fewer pages
    offset = (args.page - 1) * limit
    base = RewardScore.objects.filter(run=run, component=comp).order_by("-value", "-rollout_id")
    boundary = base.values_list("value", "rollout_id")[
        offset - 1 : offset
    ].get()  # setup, not timed
    cursor = encode_cursor(boundary[0], boundary[1])
    rollout = Rollout.objects.filter(run=run).order_by("id")[n // 2 : n // 2 + 1].get()
    group_id = rollout.group_id
    explorer = f"/runs/{run.id}/rollouts/"

    def get(url: str) -> Callable[[], None]:
        def call() -> None:
            resp = client.get(url)
            assert resp.status_code == 200, (url, resp.status_code)

        return call

    pages = [
        ("explorer p1, sort by component", f"{explorer}?sort=coverage&order=desc", 100),
        ("explorer p1, sort by component asc", f"{explorer}?sort=coverage&order=asc", 100),
        ("explorer p1, sort by reward", f"{explorer}?sort=reward&order=desc", 100),
        (
            "explorer p1, component + step filter",
            f"{explorer}?sort=correct&order=desc&step_min=200&step_max=210",
            100,
        ),
        # The worst case for a walk of the sort index: reward and the components climb over the
        # run, so the best of the first steps sort after every later step's rows.
        (
            "explorer p1, reward + first steps",
            f"{explorer}?sort=reward&order=desc&step_min=0&step_max=10",
            100,
        ),
        (
            "explorer p1, component + first steps",
            f"{explorer}?sort=correct&order=desc&step_min=0&step_max=10",
            100,
        ),
        (
            f"explorer p{args.page} by keyset (page)",
            f"{explorer}?sort=coverage&order=desc&cursor={cursor}",
            100,
        ),
        ("group view", f"/groups/{group_id}/", None),
        ("transcript (with prev/next)", f"/rollouts/{rollout.id}/?sort=coverage&order=desc", None),
        ("run dashboard", f"/runs/{run.id}/", 300),
        ("runs list", "/", None),
        ("no-signal groups", f"/runs/{run.id}/no-signal/", None),
    ]
    print(
        f"\nrun {run.id}: {n:,} rollouts, {Group.objects.filter(run=run).count():,} groups; "
        f"median of {args.repeat} requests (min), test client, DEBUG={os.environ['DEBUG']}"
    )
    print(f"{'page':42} {'median ms':>10} {'min ms':>8} {'queries':>8}  target")
    for label, url, target in pages:
        counted: list[str] = []

        def count(execute, sql, params, many, context, counted=counted):  # noqa: ANN001
            counted.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):
            get(url)()
        med, mn = median_ms(get(url), args.repeat)
        verdict = (
            "" if target is None else (f"< {target} ms  " + ("ok" if med < target else "MISSED"))
        )
        print(f"{label:42} {med:10.1f} {mn:8.1f} {len(counted):8d}  {verdict}")

    # Page `--page` and a page in the middle of the run: keyset (explore with a cursor) vs OFFSET.
    for page_no in sorted({args.page, max(2, n // limit // 2)}):
        off = (page_no - 1) * limit
        v, rid = base.values_list("value", "rollout_id")[off - 1 : off].get()  # setup, not timed
        cur = encode_cursor(v, rid)

        def by_offset(off: int = off) -> None:
            hits = list(base.values_list("rollout_id", "value")[off : off + limit])
            _hydrate(hits, list(RewardComponent.objects.filter(environment=run.environment)), comp)

        def by_keyset(cur: str = cur) -> None:
            explore(run, ExplorerQuery(sort="coverage", order="desc", cursor=cur, limit=limit))

        key_med, _ = median_ms(by_keyset, args.repeat)
        off_med, _ = median_ms(by_offset, args.repeat)
        print(
            f"page {page_no:,} (rows {off:,}..{off + limit:,}) query + hydrate: keyset "
            f"{key_med:.1f} ms, OFFSET {off_med:.1f} ms, OFFSET/keyset = {off_med / key_med:.2f}x"
        )

    if args.explain:
        from webapp.runs.queries import component_series, reward_series

        with CaptureQueriesContext(connection) as ctx:
            explore(run, ExplorerQuery(sort="coverage", order="desc", limit=limit))
            reward_series(run)
            component_series(run, list(RewardComponent.objects.filter(environment=run.environment)))
        with connection.cursor() as cur:
            for q in ctx.captured_queries:
                if (
                    "SELECT" not in q["sql"]
                    or "GROUP BY" not in q["sql"]
                    and "ORDER BY" not in q["sql"]
                ):
                    continue
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + q["sql"])
                print("\n" + q["sql"][:300] + "\n" + "\n".join(r[0] for r in cur.fetchall()))


if __name__ == "__main__":
    main()
