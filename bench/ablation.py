"""Ablation recompute at scale: read a stored run and recompute every group's advantages
for one ablation.

    DATABASE_URL=postgres://... python -m bench.ablation  # 1,000,000 rollouts, run "bench-1m"
    DATABASE_URL=postgres://... python -m bench.ablation --rollouts 80000

The run is seeded through the ingestion service if absent (G=8, 4 components, 500 steps; the same
name and shape as bench/pages.py, so whichever bench runs first seeds it for both). Prints the
end-to- end time (read + recompute; every byte from the database, read from the groups' packed
scores by webapp/rollouts/arrays.py; target < 2 s at 1M) and the ratio against a plain Python loop
over groups doing the same sum-then-normalise math, measured in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import django
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import bench_run, components, ingest_batches, ratio, report  # noqa: E402

G = 8
STEPS = 500
# The standard components with this bench's own weights (its advantage figures depend on them).
COMPONENTS = components(format={"weight": 0.5}, length_penalty={"weight": 0.2})
TARGET_S = 2.0


def run_name(n: int) -> str:
    return "bench-1m" if n == 1_000_000 else f"bench-{n}"


def _batch(rng: np.random.Generator, steps: range, groups_per_step: int) -> list[dict]:
    from training.records import GroupRecord, RolloutRecord

    groups = []
    for step in steps:
        p = 0.2 + 0.5 * step / STEPS
        for gi in range(groups_per_step):
            correct = (rng.random(G) < p).astype(float).tolist()
            fmt = (rng.random(G) < 0.9).astype(float).tolist()
            prog = np.round(rng.random(G), 3).tolist()
            lengths = rng.integers(20, 400, G).tolist()
            rollouts = [
                RolloutRecord(
                    index=i,
                    completion=f"c{i}",
                    length=lengths[i],
                    rewards={
                        "correct": correct[i],
                        "format": fmt[i],
                        "coverage": prog[i],
                        "length_penalty": -round(lengths[i] / 1000, 3),
                    },
                )
                for i in range(G)
            ]
            group = GroupRecord(step=step, key=f"p{gi}", prompt=f"prompt {gi}", rollouts=rollouts)
            groups.append(group.to_json())
    return groups


def ensure_run(n: int):
    """The stored bench run of n rollouts, seeded through the ingestion service when absent."""
    from webapp.rollouts.models import Rollout

    name = run_name(n)
    run = bench_run(name, "bench", COMPONENTS, kind="import")
    have = Rollout.objects.filter(run=run).count()
    if have >= n:
        return run
    if have:
        print(f"{name}: {have} rollouts stored, completing to {n} ...", flush=True)
    per_step = max(1, n // (G * STEPS))
    steps = max(1, n // (G * per_step))
    rng = np.random.default_rng(0)
    chunk = max(1, 2000 // per_step)  # ~2000 groups per ingest call (idempotent on retry)
    batches = (
        _batch(rng, range(s0, min(steps, s0 + chunk)), per_step) for s0 in range(0, steps, chunk)
    )
    dt = ingest_batches(run, batches, steps * per_step * G, "seeding")
    report(f"seeded {steps * per_step * G:,} rollouts in {dt:.0f} s")
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rollouts", type=int, default=1_000_000, help="size of the stored run (default 1,000,000)"
    )
    ap.add_argument(
        "--repeat", type=int, default=3, help="timed repetitions of the end-to-end ablation"
    )
    ap.add_argument(
        "--loop-groups",
        type=int,
        default=0,
        help="time the Python loop on this many groups and scale (0: all; the loop is slow)",
    )
    args = ap.parse_args(argv)
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from training import ablation as abl
    from webapp.diagnostics.services import load_run_arrays, run_ablation

    call_command(
        "migrate", verbosity=0
    )  # an older bench database gains (and backfills) the packed scores

    run = ensure_run(args.rollouts)
    spec = abl.AblationSpec(drop=("format",), weights={"correct": 2.0})
    # Cold: every byte from the database (the groups' packed scores); there is no array cache.
    colds = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = run_ablation(run, spec)
        colds.append(
            (time.perf_counter() - t0, result["timing"]["read_s"], result["timing"]["compute_s"])
        )
    data = load_run_arrays(run)
    n_groups = int(np.unique(data.group_ids).size)
    # Baseline: the same recompute (baseline and ablated advantages) as a plain Python
    # loop over groups.
    keep = np.array([c.name != "format" for c in data.components])
    w_new = [
        2.0 if c.name == "correct" else c.weight for c in data.components if c.name != "format"
    ]
    gids, mat = data.group_ids, data.matrix
    if args.loop_groups and args.loop_groups < n_groups:
        first = np.unique(gids)[: args.loop_groups]
        mask = np.isin(gids, first)
        gids, mat = gids[mask], mat[mask]
    scale = n_groups / np.unique(gids).size
    t0 = time.perf_counter()
    rows_old = list(zip(gids.tolist(), mat.tolist(), strict=True))
    rows_new = list(zip(gids.tolist(), mat[:, keep].tolist(), strict=True))
    abl.python_loop_advantages(rows_old, data.weights.tolist())
    abl.python_loop_advantages(rows_new, w_new)
    loop_s = (time.perf_counter() - t0) * scale
    cold_best = min(colds)
    cold_med = statistics.median(t for t, _, _ in colds)
    compute = min(c for _, _, c in colds)
    print(
        f"database: {connection.vendor}; run {run.name!r} (id {run.id}): {data.n:,} rollouts, "
        f"{n_groups:,} groups, {len(data.components)} components"
    )
    print(f"ablation {spec.as_dict()}")
    report(
        f"  COLD end to end (every byte from the database): best {cold_best[0]:.3f} s, median "
        f"{cold_med:.3f} s over {args.repeat} (read {cold_best[1]:.3f} s + recompute "
        f"{cold_best[2]:.3f} s)  target < {TARGET_S} s: "
        f"{'PASS' if cold_best[0] < TARGET_S else 'FAIL'}"
    )
    report(
        f"  python loop over groups (math only{', scaled' if scale != 1 else ''}): {loop_s:.2f} s  "
        f"-> vectorised recompute is {ratio(loop_s, compute, 1)} faster; cold end to end "
        f"{ratio(loop_s, cold_best[0], 1)}"
    )
    print(
        f"  mean |Δ advantage| {result['mean_abs_delta']:.4f}, sign flips "
        f"{result['sign_flip_frac']:.4f}, best changed {result['best_changed_frac']:.4f}, spearman "
        f"{result['spearman_mean']:.4f}"
    )
    return 0 if cold_best[0] < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
