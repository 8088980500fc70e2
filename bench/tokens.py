"""Per-token arrays on Postgres, in one run: (a) bytes a token on disk, (b) ingestion against a
raw COPY of the same rows, (c) the token API of a 32,000-token rollout, (d) rollout pages without
tokens before and after. Targets and the data's shape: docs/tokens.md, "Module notes".

    export DATABASE_URL=postgres://postgres@127.0.0.1:5432/rd_bench_tokens
    .venv/bin/python bench/tokens.py [--rollouts 100000]      # or: python -m bench.tokens
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training.records import GroupRecord, RolloutRecord  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

G, K = 8, 2
NAMES = ["correct", "format"]
GROUPS_PER_BATCH = 12  # 96 rollouts, ~430k tokens: ~25 MB of JSON, under the 32 MiB request limit
VOCAB = 151_936
STEPS_GROUPS = 50  # groups per step
PAGE_REPEATS = 15


def _b64(a: np.ndarray, dtype: str) -> dict[str, str]:
    raw = a.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    return {"dtype": dtype, "data": base64.b64encode(raw).decode()}


def synth_tokens(rng: np.random.Generator, n: int, form: str = "lists") -> dict[str, object]:
    """One rollout's arrays: Python lists (a client's plain JSON after json.loads), base64
    binary (the recorder's form) or numpy arrays (`raw`: the binary body's, see `body`)."""
    ranks = np.minimum(rng.zipf(1.15, n), VOCAB) - 1
    ids = (ranks * 2654435761) % VOCAB  # Zipf ranks spread over the vocabulary
    confident = rng.random(n) < 0.7
    sampler = np.where(confident, -rng.exponential(0.01, n), -rng.exponential(1.5, n))
    entropy = np.clip(-sampler * rng.uniform(0.5, 2.0, n) + rng.exponential(0.05, n), 0, 12)
    trainer = np.minimum(sampler + rng.normal(0, 0.01, n) * (1 + np.abs(sampler)), 0)
    arrays = {"sampler_logprobs": sampler, "trainer_logprobs": trainer, "entropy": entropy}
    if form == "binary":
        return {"ids": _b64(ids, "int32"), **{k: _b64(v, "float32") for k, v in arrays.items()}}
    if form == "raw":  # numpy arrays, for training/token_wire.encode
        return {"ids": ids.astype(np.int32), **{k: v.astype(np.float32) for k, v in arrays.items()}}
    return {"ids": ids.tolist(), **{k: v.astype(np.float32).tolist() for k, v in arrays.items()}}


def make_batch(
    b: int, seed: int, tokens: bool, lo: int, hi: int, form: str = "lists"
) -> list[dict]:
    """Batch `b`: the same rollouts with or without tokens (separate random streams)."""
    rng, token_rng = np.random.default_rng([seed, b]), np.random.default_rng([seed, b, 1])
    groups = []
    for gi in range(b * GROUPS_PER_BATCH, (b + 1) * GROUPS_PER_BATCH):
        rollouts = []
        for i in range(G):
            rewards = {"correct": float(rng.integers(0, 2)), "format": 1.0}
            n = int(rng.integers(lo, hi + 1))
            rollouts.append(
                RolloutRecord(
                    index=i,
                    completion=f"answer {gi} {i}: the diagram has {gi % 7} boxes",
                    rewards=rewards,
                    length=n,
                    tokens=synth_tokens(token_rng, n, form) if tokens else None,
                )
            )
        group = GroupRecord(
            step=gi // STEPS_GROUPS,
            key=f"prompt-{gi % STEPS_GROUPS}",
            prompt=f"Draw diagram {gi % STEPS_GROUPS}",
            rollouts=rollouts,
        )
        groups.append(group.to_json())
    return groups


def body(args, b: int, seed: int, tokens: bool) -> dict | bytes:
    """Batch `b` as the service receives it: the parsed JSON, or for `--form raw` the binary body
    (training/token_wire.py), which `parse` turns into the JSON form inside the timing."""
    groups = make_batch(b, seed, tokens, args.min_tokens, args.max_tokens, args.form)
    if args.form != "raw":
        return {"groups": groups}
    from training import token_wire

    return token_wire.encode({"groups": groups})


def parse(x: dict | bytes) -> dict:
    """What the API's parse_body makes of a binary body (JSON of the batch, arrays as views)."""
    if isinstance(x, dict):
        return x
    import json

    from training import token_wire

    text, data = token_wire.split(x)
    out = json.loads(text)
    token_wire.resolve(out, data)
    return out


def _n_tokens(x: dict | bytes) -> int:
    return sum(r["length"] for g in parse(x)["groups"] for r in g["rollouts"])


def new_run(name: str):
    from webapp.rollouts.services import create_run, ensure_environment

    env = ensure_environment("bench-tokens", [{"name": n, "weight": 1.0} for n in NAMES])
    return create_run(name=name, kind="import", environment=env, config={}, status="running")


def ingest_all(args, name: str, tokens: bool, seed: int) -> tuple[object, float, int]:
    """Every batch through the service (generation untimed). (run, seconds, tokens)."""
    from bench.harness import progress
    from webapp.rollouts.ingest import ingest_groups

    run, spent, n_tokens = new_run(name), 0.0, 0
    with progress(args.batches, f"service ({name})", "batch") as bar:
        for b in range(args.batches):
            x = body(args, b, seed, tokens)
            n_tokens += _n_tokens(x)
            t0 = time.perf_counter()
            ingest_groups(run, parse(x))
            spent += time.perf_counter() - t0
            bar.update(1)
    return run, spent, n_tokens


def copy_batch(run, comps, x: dict | bytes) -> float:
    """The floor for one batch: its rows built by the service's own code outside the timing
    (validation, statistics, rows, token blobs, ids drawn), then only the COPYs (the token rows
    in binary, as the service writes them: the fastest COPY of those bytes) and commit timed."""
    from django.db import transaction

    from webapp.rollouts import ingest_stats, rows
    from webapp.rollouts.ingest_write import insert, reserve_ids, upsert_step_stats
    from webapp.rollouts.models import Group, Rollout
    from webapp.rollouts.validation import validate_batch
    from webapp.tokens import ingest as tokens_ingest

    groups = validate_batch(parse(x), {c.name for c in comps})
    s = ingest_stats.of_batch(run, groups, comps)
    with transaction.atomic():
        gids, rids = reserve_ids(Group, len(groups)), reserve_ids(Rollout, len(s.group_of))
        tables = [  # built whole before the timing (the service derives text during its COPY)
            rows.Table(t.name, t.columns, list(t.rows))
            for t in rows.batch_rows(run.id, groups, comps, s, gids, rids)
        ]
        token_rows, _ = tokens_ingest.token_rows(run.id, groups, rids)
        step_rows = ingest_stats.step_stat_rows(s, comps)
        t0 = time.perf_counter()
        insert(tables)
        upsert_step_stats(run.id, step_rows)
        tokens_ingest.copy_rows(token_rows)
    return time.perf_counter() - t0


def service_and_floor(args, seed: int) -> tuple[object, float, float, int, list[float]]:
    """Each batch through the service and through the floor, alternating which goes first, so
    that the machine's load weighs on both alike. (service run, service s, floor s, tokens,
    the 1-minute load average after each batch)."""
    from bench.harness import progress
    from webapp.rollouts.ingest import ingest_groups

    run = new_run(f"bench-tokens-run-{time.time()}")
    floor = new_run(f"bench-tokens-copy-{time.time()}")
    comps = floor.components()
    t_service, t_floor, n_tokens, loads = 0.0, 0.0, 0, []
    with progress(args.batches, "service and raw COPY, alternating", "batch") as bar:
        for b in range(args.batches):
            x = body(args, b, seed, True)
            n_tokens += _n_tokens(x)
            if b % 2:
                t_floor += copy_batch(floor, comps, x)
            t0 = time.perf_counter()
            ingest_groups(run, parse(x))
            t_service += time.perf_counter() - t0
            if not b % 2:
                t_floor += copy_batch(floor, comps, x)
            loads.append(os.getloadavg()[0])
            bar.update(1)
    return run, t_service, t_floor, n_tokens, loads


def disk_bytes(run_id: int, n_tokens: int) -> dict[str, float]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT sum(octet_length(data)), count(*) FROM tokens_rollouttokens WHERE run_id = %s",
            [run_id],
        )
        blob, rows = cur.fetchone()
        cur.execute("SELECT count(*) FROM tokens_rollouttokens")
        all_rows = cur.fetchone()[0]
        cur.execute("SELECT pg_total_relation_size('tokens_rollouttokens')")
        table = cur.fetchone()[0]
    share = rows / max(all_rows, 1)  # the table holds this run's rows and the raw COPY's
    return {"blob": blob / n_tokens, "table": table * share / n_tokens}


def token_api(client, rollout_id: int) -> list[float]:
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        res = client.get(f"/api/v1/rollouts/{rollout_id}/tokens/")
        times.append(time.perf_counter() - t0)
        assert res.status_code == 200 and len(res.content) > 100_000
    return times


def big_rollout(client_user) -> int:
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.models import Rollout

    run = new_run(f"bench-tokens-big-{time.time()}")
    rng = np.random.default_rng(9)
    t = synth_tokens(rng, 32_000)  # lists: the API's reading is what is timed
    t["offsets"] = np.arange(32_000).tolist()
    t["loss_mask"] = [1] * 32_000
    t["advantages"] = [0.37] * 32_000
    g = {"step": 0, "key": "big", "prompt": "p", "rollouts": []}
    g["rollouts"].append({"index": 0, "completion": "x" * 32_000, "tokens": t})
    ingest_groups(run, {"groups": [g]})
    return Rollout.objects.get(run=run).id


def page_times(client, run) -> dict[str, float]:
    """Median seconds of the explorer page, the explorer API and a transcript page of `run`."""
    from webapp.rollouts.models import Rollout

    rid = Rollout.objects.filter(run=run).order_by("id").values_list("id", flat=True)[500]
    urls = {
        "explorer page": f"/runs/{run.id}/rollouts/?sort=reward&order=desc",
        "explorer API": f"/api/v1/runs/{run.id}/rollouts/?sort=correct&order=desc&limit=100",
        "transcript page": f"/rollouts/{rid}/?sort=reward&order=desc",
    }
    out = {}
    for name, url in urls.items():
        client.get(url)  # warm
        times = []
        for _ in range(PAGE_REPEATS):
            t0 = time.perf_counter()
            assert client.get(url).status_code == 200
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


def _fresh_token_table() -> None:
    """An empty token table still holds the space of deleted runs (earlier benches): rewrite it
    so that its size is this run's."""
    from django.db import connection

    from webapp.tokens.models import RolloutTokens

    if not RolloutTokens.objects.exists():
        with connection.cursor() as cur:
            cur.execute("VACUUM FULL tokens_rollouttokens")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100_000, help="rollouts with tokens")
    parser.add_argument("--min-tokens", type=int, default=1_000)
    parser.add_argument("--max-tokens", type=int, default=8_000)
    parser.add_argument(
        "--form",
        choices=("raw", "binary", "lists"),
        default="raw",
        help="how the arrays arrive: a binary body (training/token_wire.py), base64 binary "
        "(the recorder's form) or JSON lists",
    )
    parser.add_argument("--keep", action="store_true", help="keep the bench runs afterwards")
    args = parser.parse_args()
    args.batches = max(1, args.rollouts // (G * GROUPS_PER_BATCH))

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from bench.harness import require_postgres

    if connection.vendor != "postgresql":
        sys.exit("bench/tokens.py measures Postgres: set DATABASE_URL=postgres://...")
    require_postgres()
    call_command("migrate", verbosity=0)
    from django.contrib.auth import get_user_model

    from webapp.accounts.roles import set_role

    user, _ = get_user_model().objects.get_or_create(username="bench-tokens")
    set_role(user, "viewer")
    client = Client()
    client.force_login(user)

    _fresh_token_table()
    n = args.batches * GROUPS_PER_BATCH * G
    print(
        f"rollouts: {n:,} with {args.min_tokens:,}-{args.max_tokens:,} tokens, arrays as "
        f"{args.form}; load {_load()}"
    )
    twin, _, _ = ingest_all(args, f"bench-tokens-twin-{time.time()}", tokens=False, seed=0)
    before = page_times(client, twin)
    run, t_service, t_copy, n_tokens, loads = service_and_floor(args, seed=0)
    after = page_times(client, run)
    twin_again = page_times(client, twin)
    api = token_api(client, big_rollout(user))
    size = disk_bytes(run.id, n_tokens)
    print(f"tokens: {n_tokens:,} ({n_tokens / n:,.0f} a rollout)")
    print(f"(a) bytes a token on disk: {size['table']:.2f} (table + TOAST + indexes; target <= 8)")
    print(f"    of which the compressed arrays: {size['blob']:.2f}")
    print(f"(b) service  : {n_tokens / t_service / 1e6:8.2f} M tokens/s ({t_service:.1f} s)")
    print(f"    raw COPY : {n_tokens / t_copy / 1e6:8.2f} M tokens/s ({t_copy:.1f} s)  floor")
    print(f"    ratio service / raw COPY = {t_copy / t_service:.2f} (target >= 0.5)")
    q = statistics.quantiles(loads, n=4) if len(loads) > 1 else loads * 3
    print(f"    1-minute load during it: min {min(loads):.2f}, quartiles "
          f"{q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f}, max {max(loads):.2f}")  # fmt: skip
    med = statistics.median(api) * 1000
    print(f"(c) token API, 32,000 tokens: median {med:.1f} ms, max {max(api) * 1000:.1f} ms "
          "(target < 200 ms)")  # fmt: skip
    print("(d) pages, median s: without tokens (twin) / with tokens / twin again")
    for name in before:
        ratio = after[name] / before[name]
        print(
            f"    {name:16s} {before[name]:.4f} / {after[name]:.4f} / {twin_again[name]:.4f}"
            f"  with/without = {ratio:.2f}"
        )
    print(f"load average: {_load()} (2 cores, shared with other work)")
    if not args.keep:
        from webapp.runs.models import Run

        Run.objects.filter(name__startswith="bench-tokens-").delete()


if __name__ == "__main__":
    main()
