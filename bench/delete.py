"""Deleting a large run while another run ingests and is read (issue 30, item 4).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/rd_bench_delete .venv/bin/python bench/delete.py
    ... bench/delete.py --rollouts 1000000 --cascade

Seeds run A (bench/bulk.py), runs an ingester and a reader on run B, and prints their latencies
during a quiet baseline and during the batched delete of A (--cascade: also one Run.delete()),
then the table sizes before and after. Details: docs/performance.md, "Module notes".
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bulk import AGENT_COMPONENTS  # noqa: E402
from bench.harness import load_average, setup_django, with_load  # noqa: E402

TABLES = (
    "rollouts_group",
    "rollouts_rollout",
    "rollouts_rewardscore",
    "rollouts_groupcomponentstat",
)


def _setup() -> None:
    setup_django(postgres=False, migrate=False)


def _env():
    from webapp.rollouts.services import ensure_environment

    return ensure_environment("bench-delete", [{"name": c} for c in AGENT_COMPONENTS])


def seed(name: str, n_rollouts: int):
    from django.db import connection

    from bench.bulk import agent_group, fill_run
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run

    run = create_run(name=name, kind="import", environment=_env(), config={}, status="running")
    rng = random.Random(3)
    ingest_groups(run, {"groups": [agent_group(0, f"g{k}", 16, rng) for k in range(16)]})
    copies = max(0, n_rollouts // 256 - 1)
    t0 = time.perf_counter()
    with connection.cursor() as cur:
        for first in range(1, copies + 1, 200):  # 51,200 rollouts per statement
            fill_run(cur, run.id, min(200, copies + 1 - first), first_step=first)
        cur.execute("ANALYZE")
    print(
        f"seeded run {run.id}: {256 * (copies + 1):,} rollouts in {time.perf_counter() - t0:.0f} s"
    )
    return run


def ingester(run_id: int, out, stop) -> None:
    _setup()
    from bench.bulk import agent_group
    from webapp.rollouts.ingest import ingest_groups
    from webapp.runs.models import Run

    run, rng, step = Run.objects.get(id=run_id), random.Random(5), 1000
    while not stop.is_set():
        body = {"groups": [agent_group(step, f"b{k}", 8, rng) for k in range(4)]}
        t0 = time.perf_counter()
        ingest_groups(run, body)
        out.put(("ingest", time.time(), time.perf_counter() - t0))
        step += 1


def reader(run_id: int, out, stop) -> None:
    _setup()
    from webapp.rollouts.models import Rollout

    while not stop.is_set():
        t0 = time.perf_counter()
        top = list(
            Rollout.objects.filter(run_id=run_id)
            .order_by("-reward", "-id")
            .values_list("id", "group_id", "preview_head")[:50]
        )
        if top:
            list(Rollout.objects.filter(group_id=top[0][1]).values_list("id", "preview_head"))
        out.put(("read", time.time(), time.perf_counter() - t0))
        time.sleep(0.05)


def sizes() -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c WHERE c.relname = ANY(%s)",
            [list(TABLES)],
        )
        return int(cur.fetchone()[0])


def summary(samples, start: float, end: float, kind: str) -> str:
    xs = sorted(s for k, t, s in samples if k == kind and start <= t <= end)
    if not xs:
        return f"{kind}: no samples"
    p95 = xs[min(len(xs) - 1, int(0.95 * len(xs)))]
    return (
        f"{kind} n={len(xs)} p50 {statistics.median(xs) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
        f"max {xs[-1] * 1000:.0f} ms"
    )


def drain(q, samples) -> None:
    while not q.empty():
        samples.append(q.get())


def timed_phase(label: str, q, samples, action) -> float:
    start = time.time()
    action()
    end = time.time()
    time.sleep(0.5)
    drain(q, samples)
    print(
        with_load(
            f"{label}: {end - start:.1f} s; {summary(samples, start, end, 'ingest')}; "
            f"{summary(samples, start, end, 'read')}"
        ),
        flush=True,
    )
    return end - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, default=200_000, help="rollouts in the deleted run")
    p.add_argument("--baseline", type=float, default=10.0, help="seconds of quiet measurement")
    p.add_argument("--cascade", action="store_true", help="also time one Run.delete() cascade")
    args = p.parse_args(argv)
    setup_django()
    from webapp.rollouts.services import create_run
    from webapp.runs import deletion
    from webapp.runs.models import Run

    empty = sizes()
    victim = seed(f"bench-delete-{time.time():.0f}", args.rollouts)
    footprint = sizes() - empty
    twin = seed(f"bench-cascade-{time.time():.0f}", args.rollouts) if args.cascade else None
    other = create_run(
        name="bench-live", kind="import", environment=_env(), config={}, status="running"
    )
    from bench.bulk import agent_group
    from webapp.rollouts.ingest import ingest_groups

    ingest_groups(
        other, {"groups": [agent_group(0, f"s{k}", 8, random.Random(k)) for k in range(64)]}
    )
    before = sizes()
    ctx = mp.get_context("spawn")
    q, stop = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=f, args=(other.id, q, stop)) for f in (ingester, reader)]
    for proc in procs:
        proc.start()
    samples: list = []
    time.sleep(5)  # children start up
    drain(q, samples)
    timed_phase("baseline (no delete)", q, samples, lambda: time.sleep(args.baseline))
    report = {}

    def batched() -> None:
        deletion.request_delete(victim)
        report["r"] = deletion.reap(victim.id)

    dt = timed_phase(f"batched delete of {args.rollouts:,} rollouts", q, samples, batched)
    r = report["r"]
    print(
        f"  {args.rollouts / dt:,.0f} rollouts/s, {r.batches} batches, longest "
        f"{r.longest_batch_s:.2f} s, rows {r.rows}, finished {r.finished}"
    )
    if twin is not None:
        timed_phase(
            "one-transaction cascade (Run.delete())",
            q,
            samples,
            lambda: Run.objects.filter(id=twin.id).delete(),
        )
    stop.set()
    for proc in procs:
        proc.join(30)
    after = sizes()
    from django.db import connection

    with connection.cursor() as cur:
        for table in TABLES:
            cur.execute(f"VACUUM {table}")
    vacuumed = sizes()
    refill = seed(f"bench-refill-{time.time():.0f}", args.rollouts)
    refilled = sizes()
    mb = 1024 * 1024
    print(
        f"tables: {before / mb:,.0f} MB before, {after / mb:,.0f} MB after the delete, "
        f"{vacuumed / mb:,.0f} MB after VACUUM, {refilled / mb:,.0f} MB after ingesting "
        f"{args.rollouts:,} rollouts again: grew {(refilled - vacuumed) / mb:,.0f} MB for a run "
        f"that took {footprint / mb:,.0f} MB when first stored (the freed space is reused; "
        "VACUUM FULL or pg_repack would return it to the OS)"
    )
    deletion.request_delete(refill)
    deletion.reap(refill.id)
    deletion.request_delete(other)
    deletion.reap(other.id)
    print(f"load average: {load_average()} (shared machine)")


if __name__ == "__main__":
    main()
