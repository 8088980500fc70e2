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
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.harness import (  # noqa: E402
    COMPONENTS,
    bench_run,
    ingest_batches,
    median_ms,
    ratio,
    report,
    setup_django,
    vacuum_analyze,
)
from training.records import GroupRecord, RolloutRecord  # noqa: E402

G = 8
STEPS = 500
BATCH_GROUPS = 250
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


def seed(n_rollouts: int, window: int = 0, no_seed: bool = False) -> Any:
    import numpy as np

    from webapp.rollouts.models import Group

    groups_per_step = max(1, n_rollouts // (G * STEPS))
    name = f"bench-pages-{n_rollouts}"
    run = bench_run(
        name,
        "bench-4c",
        COMPONENTS,
        config={"num_generations": G},
        base_model="bench/tiny",
    )
    done = set(Group.objects.filter(run=run).values_list("step", flat=True).distinct())
    todo = [s for s in range(STEPS) if s not in done]
    if not todo or no_seed:
        from webapp.rollouts.models import StepStat
        from webapp.rollouts.services import recompute_run_stats

        if not StepStat.objects.filter(run=run).exists():  # seeded before StepStat existed
            print("building per-step statistics for the seeded run ...")
            recompute_run_stats(run)
        print(f"reusing seeded run {run.id} ({name}, {len(done)} of {STEPS} steps)")
        return run
    rng = np.random.default_rng(len(done))
    per_batch = max(1, BATCH_GROUPS // groups_per_step)  # whole steps per batch, ~250 groups
    batches = (
        [g for s in todo[i : i + per_batch] for g in synthetic_step(s, groups_per_step, rng)]
        for i in range(0, len(todo), per_batch)
    )
    n = len(todo) * groups_per_step * G
    dt = ingest_batches(run, batches, n, "seeding", window)
    report(f"seeded {n:,} rollouts in {dt:.0f} s ({n / dt:,.0f} rollouts/s)")
    vacuum_analyze()
    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--page", type=int, default=500, help="the deep page for keyset vs OFFSET")
    parser.add_argument(
        "--explain", action="store_true", help="print EXPLAIN ANALYZE of the key queries"
    )
    parser.add_argument(
        "--window",
        type=int,
        default=1_000_000,
        help="print the seeding's rollouts/s per this many rollouts (ingestion as tables grow)",
    )
    parser.add_argument(
        "--no-seed", action="store_true", help="time the pages on what is stored (a partial seed)"
    )
    args = parser.parse_args(argv)
    setup_django()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext  # EXPLAIN only: queries of direct calls

    from webapp.accounts.roles import set_role
    from webapp.explorer.paging import encode_cursor
    from webapp.explorer.params import ExplorerQuery
    from webapp.explorer.query import _hydrate, explore
    from webapp.rollouts.models import Group, RewardComponent, RewardScore, Rollout

    run = seed(args.rollouts, args.window, args.no_seed)
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
        # Step ranges at other positions and widths: the last steps (the top of the sort order),
        # one step, wide ranges (a component or the reward: per-step tops merged, migration 0012).
        (
            "explorer p1, component + last steps",
            f"{explorer}?sort=correct&order=desc&step_min={STEPS - 11}&step_max={STEPS - 1}",
            100,
        ),
        (
            "explorer p1, component + one step",
            f"{explorer}?sort=coverage&order=desc&step_min=250&step_max=250",
            100,
        ),
        (
            "explorer p1, reward + steps 0-99 (20%)",
            f"{explorer}?sort=reward&order=desc&step_min=0&step_max=99",
            100,
        ),
        (
            "explorer p1, component + steps 0-149",
            f"{explorer}?sort=coverage&order=desc&step_min=0&step_max=149",
            100,
        ),
        (
            "explorer p1, reward + steps 0-149",
            f"{explorer}?sort=reward&order=desc&step_min=0&step_max=149",
            100,
        ),
        (
            "explorer p1, component asc + steps 350-499",
            f"{explorer}?sort=coverage&order=asc&step_min=350&step_max=499",
            100,
        ),
        (
            "explorer p1, component + every step 0-499",
            f"{explorer}?sort=coverage&order=desc&step_min=0&step_max={STEPS - 1}",
            100,
        ),
        # Advantage and length have no per-step index (range_first: read whole or walked).
        (
            "explorer p1, advantage + steps 0-99 (20%)",
            f"{explorer}?sort=advantage&order=desc&step_min=0&step_max=99",
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
        ("diagnostics page (cached diagnosis)", f"/diagnostics/runs/{run.id}/", None),
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
        report(f"{label:42} {med:10.1f} {mn:8.1f} {len(counted):8d}  {verdict:16}")

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
        report(
            f"page {page_no:,} (rows {off:,}..{off + limit:,}) query + hydrate: keyset "
            f"{key_med:.1f} ms, OFFSET {off_med:.1f} ms, OFFSET/keyset = {ratio(off_med, key_med)}"
        )

    # The ablation's cold recompute (what the diagnostics page's ablation form runs): every
    # group's packed scores read from the database, then the vectorised math.
    from training.ablation import AblationSpec
    from webapp.diagnostics.services import run_ablation

    spec = AblationSpec(drop=("format",), weights={"correct": 2.0})
    for _ in range(2):
        t = run_ablation(run, spec)["timing"]
        report(
            f"ablation cold (drop format, correct=2): {t['read_s'] + t['compute_s']:.2f} s (read "
            f"{t['read_s']:.2f} s + recompute {t['compute_s']:.2f} s)  target < 10 s"
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
