"""Reward replay at scale: re-score stored diagram rollouts with a changed component
and recompute advantages.

    DATABASE_URL=postgres://... python -m bench.replay                   # 100,000 rollouts
    DATABASE_URL=postgres://... python -m bench.replay --rollouts 20000  # fits a loaded box

Seeds a diagram run through the ingestion service if absent (run "bench-replay-<N>", G=8, every
rollout a realistic completion of its own synthetic prompt, scored by the environment as the
recorder would), then replays it with `semantic_coverage@strict` twice: once with one worker
process, once with two, each a real `services.work` loop in its own process claiming chunks from the
database (what Celery worker processes run). Prints the wall time per 1,000 rollouts (scoring +
storing + summary with the advantages recomputed), the 2-vs-1 process ratio measured in this run,
and the load average before and after: on a shared 2-core machine the ratio says as much about the
neighbours as about the code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import django

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import load_line, require_postgres  # noqa: E402

G = 8
GROUPS_PER_STEP = 16
TARGET_S = 60.0  # the target for 100,000 rollouts


def _completions(prompt) -> list[str]:
    """A group's G completions: exact, an edge missing, a node missing, edge
    spam, stacked, prose..."""
    from tests.webapp.replay_fixtures import actions

    nodes = prompt.spec["nodes"]
    edges = [tuple(e) for e in prompt.spec["edges"]]
    spam = [(a, b) for a in nodes[:4] for b in nodes[:4] if a != b]
    return [
        actions(nodes, edges),
        actions(nodes, edges[:-1]),
        actions(nodes[:-1], edges[:-2]),
        actions(nodes, edges + spam),
        actions(nodes, edges, stacked=True),
        actions([*nodes, "Extra"], edges),
        "I would draw " + ", ".join(nodes),
        actions(nodes[:2], edges[:1]),
    ]


def seed(n: int):
    from training.environments import diagram
    from training.records import GroupRecord, RolloutRecord, Score
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run, environment_from_training
    from webapp.runs.models import Run

    name = f"bench-replay-{n}"
    run = Run.objects.filter(name=name).first()
    if run is not None and run.groups.count() * G >= n:
        return run
    Run.objects.filter(name=name).delete()
    env = diagram.DiagramEnvironment()
    run = create_run(
        name=name,
        kind="grpo",
        environment=environment_from_training(env),
        config={},
        status="succeeded",
    )
    n_groups = n // G
    prompts = env.prompts("train", min(n_groups, 3000))
    t0 = time.perf_counter()
    for start in range(0, n_groups, 200):
        groups = []
        for gi in range(start, min(start + 200, n_groups)):
            p = prompts[gi % len(prompts)]
            rollouts = []
            for i, c in enumerate(_completions(p)):
                s = env.score(p, c)
                rollouts.append(
                    RolloutRecord(
                        index=i,
                        transcript=[
                            {"role": "user", "content": p.text},
                            {"role": "assistant", "content": c},
                        ],
                        rewards={k: Score(v.value, v.reason) for k, v in s.items()},
                    )
                )
            group = GroupRecord(
                step=gi // GROUPS_PER_STEP, key=f"{p.key}-{gi}", prompt=p.text, rollouts=rollouts
            )
            groups.append(group.to_json())
        ingest_groups(run, {"groups": groups})
    print(f"seeded {n_groups * G:,} rollouts in {time.perf_counter() - t0:.1f} s", flush=True)
    return run


def seed_sandboxed(n: int):
    """An ask_to_code run whose `correctness` replay re-runs every submitted program
    in the sandbox."""
    from training.environments import ask_to_code as atc
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run, environment_from_training
    from webapp.runs.models import Run

    name = f"bench-replay-sandbox-{n}"
    run = Run.objects.filter(name=name).first()
    if run is not None:
        return run
    env = atc.AskToCodeEnv()
    run = create_run(
        name=name,
        kind="grpo",
        environment=environment_from_training(env),
        config={},
        status="succeeded",
    )
    groups = max(1, n // 6)
    ingest_groups(
        run, {"groups": atc.generate_groups(env, steps=1, groups_per_step=groups, G=6, seed=7)}
    )
    return run


def sandbox_throughput(n: int) -> dict:
    """One worker process replaying ask_to_code's correctness: each distinct submission runs
    in the sandbox."""
    from webapp.replays import services
    from webapp.replays.models import Replay

    run = seed_sandboxed(n)
    replay = services.create_replay(
        run, {"versions": [{"version": "correctness"}], "name": "bench sandbox"}
    )
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bench.replay", "--work", str(replay.id)], check=True)
    elapsed = time.perf_counter() - t0
    replay = Replay.objects.get(id=replay.id)
    return {
        "sandbox_rollouts": replay.done,
        "sandbox_s": round(elapsed, 2),
        "sandbox_per_1000_s": round(elapsed / max(replay.done, 1) * 1000, 1),
        "sandbox_failed": replay.failed,
        "sandbox_status": replay.status,
    }


def work(replay_id: int) -> None:
    from webapp.replays import services

    services.work(replay_id, f"bench-{os.getpid()}")


def timed_replay(run, processes: int) -> tuple[float, dict]:
    from webapp.replays import services
    from webapp.replays.models import Replay

    replay = services.create_replay(
        run,
        {
            "versions": [{"version": "semantic_coverage@strict"}],
            "name": f"bench {processes} process(es)",
        },
    )
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen([sys.executable, "-m", "bench.replay", "--work", str(replay.id)])
        for _ in range(processes)
    ]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - t0
    replay = Replay.objects.get(id=replay.id)
    if any(codes) or replay.status != "succeeded":
        raise SystemExit(
            f"replay {replay.id} ended {replay.status} (exit codes {codes}): {replay.error}"
        )
    from django.db.models import Min

    # What a warm Celery worker would take: from the first chunk claimed to the summary stored (the
    # wall time above also holds each bench process's interpreter and Django start-up).
    first = replay.chunks.aggregate(t=Min("claimed_at"))["t"]
    seconds = sorted(replay.chunks.values_list("seconds", flat=True))
    return elapsed, {
        "done": replay.done,
        "summary": replay.summary,
        "chunk_s": seconds[len(seconds) // 2],
        "warm_s": (replay.finished_at - first).total_seconds(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument(
        "--sandbox-rollouts",
        type=int,
        default=48,
        help="also replay this many ask_to_code rollouts through the sandbox (0: skip)",
    )
    parser.add_argument("--work", type=int, help=argparse.SUPPRESS)  # internal: one worker process
    args = parser.parse_args()
    if args.work:
        django.setup()
        return work(args.work)
    require_postgres()  # the design's database at this size
    django.setup()
    run = seed(args.rollouts)
    n = run.groups.count() * G
    load0 = os.getloadavg()
    one, info1 = timed_replay(run, 1)
    two, info2 = timed_replay(run, 2)
    sandbox = sandbox_throughput(args.sandbox_rollouts) if args.sandbox_rollouts else {}
    load1 = os.getloadavg()
    print(
        json.dumps(
            {
                "rollouts": n,
                "one_process_s": round(one, 2),
                "two_processes_s": round(two, 2),
                "per_1000_one_s": round(one / n * 1000, 3),
                "per_1000_two_s": round(two / n * 1000, 3),
                "speedup_two_vs_one": round(one / two, 2),
                "warm_one_s": round(info1["warm_s"], 2),
                "warm_two_s": round(info2["warm_s"], 2),
                "warm_speedup": round(info1["warm_s"] / info2["warm_s"], 2),
                "median_chunk_s_one": round(info1["chunk_s"], 3),
                "median_chunk_s_two": round(info2["chunk_s"], 3),
                "projected_100k_two_warm_s": round(info2["warm_s"] / n * 100_000, 1),
                "target_100k_s": TARGET_S,
                "loadavg_before": [round(x, 2) for x in load0],
                "loadavg_after": [round(x, 2) for x in load1],
                "cpus": os.cpu_count(),
                **sandbox,
            },
            indent=1,
        )
    )
    print(info2["summary"])
    print(load_line())


if __name__ == "__main__":
    main()
