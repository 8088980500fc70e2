"""Load: concurrent ingestion and explorer reads against a real server process, on Postgres.

    DATABASE_URL=postgres://... python bench/load.py [--seconds 60] [--writers 4] [--readers 8]

Starts the production server (`make serve`: gunicorn, workers sized to the machine) on a free
loopback port against DATABASE_URL (migrated first; the database is created when missing),
seeds a run, then measures in the same run:
  1. baseline: R readers paging GET /api/v1/runs/{id}/rollouts/?sort=<component>&cursor=... alone;
  2. load: W writers posting batches of groups through training/client.py while the R readers page.
Reports errors, lost rollouts (acknowledged vs stored) and read latency p50/p95 under load vs
baseline. Loopback only, bounded by --seconds. Exits non-zero on any error or lost rollout.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import COMPONENT_NAMES, create_database, database_name, load_line  # noqa: E402

COMPONENTS = list(COMPONENT_NAMES)
from training.records import GroupRecord, RolloutRecord  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def batch(writer: int, n: int, groups: int, size: int, rng: random.Random) -> list[dict]:
    out = []
    for g in range(groups):
        rollouts = [
            RolloutRecord(
                index=i,
                completion=f"answer {i} " + "word " * rng.randint(5, 60),
                rewards={c: round(rng.random(), 3) for c in COMPONENTS},
                length=rng.randint(5, 300),
            )
            for i in range(size)
        ]
        prompt = f"Prompt {writer}.{n}.{g}: solve it"
        group = GroupRecord(step=n, key=f"w{writer}-b{n}-g{g}", prompt=prompt, rollouts=rollouts)
        out.append(group.to_json())
    return out


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Reader(threading.Thread):
    """Pages the explorer API sorted by one component after another, up to 5 pages per sort."""

    def __init__(
        self, base: str, token: str, run_id: int, stop: threading.Event, seed: int
    ) -> None:
        super().__init__(daemon=True)
        self.base, self.token, self.run_id, self.stop = base, token, run_id, stop
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.rng = random.Random(seed)

    def run(self) -> None:
        while not self.stop.is_set():
            sort, order, cursor = (
                self.rng.choice(COMPONENTS),
                self.rng.choice(["asc", "desc"]),
                None,
            )
            for _ in range(5):
                q = {
                    "sort": sort,
                    "order": order,
                    "limit": 50,
                    **({"cursor": cursor} if cursor else {}),
                }
                req = urllib.request.Request(
                    f"{self.base}/api/v1/runs/{self.run_id}/rollouts/?{urllib.parse.urlencode(q)}",
                    headers={"Authorization": f"Token {self.token}"},
                )
                t0 = time.perf_counter()
                try:
                    with urllib.request.urlopen(req, timeout=30) as res:
                        import json

                        page = json.loads(res.read())
                except (urllib.error.URLError, OSError, ValueError) as e:
                    self.errors.append(repr(e))
                    break
                self.latencies.append(time.perf_counter() - t0)
                cursor = page.get("next")
                if not cursor or self.stop.is_set():
                    break


class Writer(threading.Thread):
    def __init__(
        self, client, run_id: int, idx: int, stop: threading.Event, groups: int, size: int
    ) -> None:
        super().__init__(daemon=True)
        self.client, self.run_id, self.idx, self.stop = client, run_id, idx, stop
        self.groups, self.size = groups, size
        self.acked_rollouts = 0
        self.batches = 0
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.rng = random.Random(idx)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            body = batch(self.idx, n, self.groups, self.size, self.rng)
            t0 = time.perf_counter()
            try:
                res = self.client.post_groups(self.run_id, body)
            except Exception as e:  # every failure is reported in the summary
                self.errors.append(repr(e))
                n += 1
                continue
            self.latencies.append(time.perf_counter() - t0)
            self.acked_rollouts += res["rollouts"]
            self.batches += 1
            n += 1


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds (user + system) of every process in a process group, exited children included
    (a parent's cutime/cstime holds the children it reaped). Linux /proc; 0.0 elsewhere."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if int(fields[2]) == pgid:  # after the command: state, ppid, pgrp, ...; utime is 14th
            total += sum(int(f) for f in fields[11:15]) / tick
    return total


def run_phase(
    base: str,
    token: str,
    run_id: int,
    seconds: float,
    readers: int,
    writers: list,
    server_pgid: int,
) -> dict:
    stop = threading.Event()
    rs = [Reader(base, token, run_id, stop, seed=i) for i in range(readers)]
    load_before, cpu0 = os.getloadavg()[0], group_cpu_seconds(server_pgid)
    for t in rs + writers:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in rs + writers:
        t.join(timeout=60)
    cpu = group_cpu_seconds(server_pgid) - cpu0
    lat = [x for r in rs for x in r.latencies]
    return {
        "reads": len(lat),
        "p50": percentile(lat, 0.5),
        "p95": percentile(lat, 0.95),
        "p99": percentile(lat, 0.99),
        "server_cpu": cpu,  # gunicorn's CPU seconds in the phase (Postgres not included)
        "load": (load_before, os.getloadavg()[0]),
        "read_errors": sum(len(r.errors) for r in rs),
        "errors": [e for r in rs for e in r.errors][:3],
    }


STATS_TABLES = (
    "rollouts_rollout",
    "rollouts_rewardscore",
    "rollouts_group",
    "rollouts_groupcomponentstat",
    "rollouts_stepstat",
)


def analyze_if_no_autovacuum() -> bool:
    """A Postgres with autovacuum off (this machine's) never gathers statistics: on tables the bench
    created, the planner then assumes a handful of rows and picks a bitmap scan plus a sort of every
    score of the run over the index walk (53 ms instead of 0.1 ms at 67k rollouts). Production runs
    autovacuum, which analyzes a table soon after it fills; here ANALYZE runs once, after seeding
    (the planner scales the statistics with the table as it grows). True when it ran."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SHOW autovacuum")
        if cur.fetchone()[0] == "on":
            return False
        for table in STATS_TABLES:
            cur.execute(f"ANALYZE {table}")
    return True


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--seconds", type=float, default=60, help="length of the load phase (baseline: a third)"
    )
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--groups", type=int, default=8, help="groups per posted batch")
    ap.add_argument("--group-size", type=int, default=8, help="rollouts per group")
    ap.add_argument(
        "--seed-groups", type=int, default=400, help="groups stored before the baseline"
    )
    args = ap.parse_args()
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        print("bench/load.py needs DATABASE_URL=postgres://... (a real Postgres)", file=sys.stderr)
        return 2
    create_database(database_name(url), url)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # the server's settings are make serve's own
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True
    )

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from training.client import Client
    from webapp.accounts.roles import set_role
    from webapp.rollouts.models import Rollout

    user, _ = get_user_model().objects.get_or_create(username="load-bench")
    set_role(user, "trainer")
    token = Token.objects.get_or_create(user=user)[0].key

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (
        open(ROOT / "var" / "load-server.log", "ab")  # noqa: SIM115 (the server's, for its life)
        if (ROOT / "var").is_dir()
        else subprocess.DEVNULL
    )
    server_env = dict(
        env,
        DEBUG="0",
        SECURE_SSL_REDIRECT="0",
        SECRET_KEY=os.environ.get(
            "SECRET_KEY", "load-bench-only-secret-key-0123456789-abcdefghijkl"
        ),
    )
    server = subprocess.Popen(
        ["make", "serve", f"BIND=127.0.0.1:{port}"],
        cwd=ROOT,
        env=server_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180  # make serve collects static files first
        while True:
            try:
                urllib.request.urlopen(f"{base}/healthz", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    print("the server did not start", file=sys.stderr)
                    return 1
                time.sleep(0.2)
        client = Client(base, token, timeout=60, retries=3, backoff=0.5)
        run_id = client.create_run(
            f"load {time.strftime('%H:%M:%S')}", environment="load-bench", components=COMPONENTS
        )
        rng = random.Random(0)
        seeded = 0
        for n in range(0, args.seed_groups, 50):
            seeded += client.post_groups(
                run_id, batch(99, n, min(50, args.seed_groups - n), args.group_size, rng)
            )["rollouts"]
        analyzed = analyze_if_no_autovacuum()
        baseline = run_phase(
            base, token, run_id, max(5.0, args.seconds / 3), args.readers, [], server.pid
        )
        writers = [
            Writer(
                Client(base, token, timeout=60, retries=5, backoff=0.5),
                run_id,
                i,
                threading.Event(),
                args.groups,
                args.group_size,
            )
            for i in range(args.writers)
        ]
        stop_writers = threading.Event()
        for w in writers:
            w.stop = stop_writers
        timer = threading.Timer(args.seconds, stop_writers.set)
        timer.start()
        loaded = run_phase(base, token, run_id, args.seconds, args.readers, writers, server.pid)
        stop_writers.set()
        acked = sum(w.acked_rollouts for w in writers)
        stored = Rollout.objects.filter(run_id=run_id).count()
        write_errors = sum(len(w.errors) for w in writers)
        wl = [x for w in writers for x in w.latencies]
        batches = sum(w.batches for w in writers)
        lost = seeded + acked - stored
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)

    ratio50 = loaded["p50"] / baseline["p50"]
    ratio95 = loaded["p95"] / baseline["p95"]
    print(
        f"\nload bench: {args.writers} writers x {args.groups}x{args.group_size} rollouts per "
        f"batch, {args.readers} readers, {args.seconds:g} s under load, Postgres, gunicorn (make "
        "serve)"
    )
    print(f"{'':<28}{'baseline':>12}{'under load':>12}{'ratio':>8}")
    print(f"{'explorer reads':<28}{baseline['reads']:>12}{loaded['reads']:>12}")
    print(
        f"{'read p50 (ms)':<28}{baseline['p50'] * 1e3:>12.1f}{loaded['p50'] * 1e3:>12.1f}"
        f"{ratio50:>8.2f}"
    )
    print(
        f"{'read p95 (ms)':<28}{baseline['p95'] * 1e3:>12.1f}{loaded['p95'] * 1e3:>12.1f}"
        f"{ratio95:>8.2f}"
    )
    print(
        f"{'read p99 (ms)':<28}{baseline['p99'] * 1e3:>12.1f}{loaded['p99'] * 1e3:>12.1f}"
        f"{loaded['p99'] / baseline['p99']:>8.2f}"
    )
    per_req = [
        phase["server_cpu"] * 1e3 / max(1, phase["reads"] + extra)
        for phase, extra in ((baseline, 0), (loaded, batches))
    ]
    print(f"{'server CPU ms per request':<28}{per_req[0]:>12.1f}{per_req[1]:>12.1f}")
    print(
        f"{'load average (start, end)':<28}"
        + "".join(f"{f'{a:.1f}, {b:.1f}':>12}" for a, b in (baseline["load"], loaded["load"]))
    )
    print(f"{'batches posted (acked)':<28}{'':>12}{batches:>12}")
    print(f"{'rollouts acked':<28}{seeded:>12}{acked:>12}")
    print(f"{'ingest rollouts/s':<28}{'':>12}{acked / args.seconds:>12.0f}")
    print(
        f"{'write p50 / p95 (ms)':<28}{'':>12}"
        f"{percentile(wl, 0.5) * 1e3:>6.0f}/{percentile(wl, 0.95) * 1e3:<5.0f}"
    )
    print(f"{'rollouts stored (db)':<28}{stored:>24}")
    under = f"{loaded['read_errors']} / {write_errors}"
    print(f"{'errors (read / write)':<28}{baseline['read_errors']:>12}{under:>12}")
    print(f"{'lost rollouts':<28}{lost:>24}")
    if analyzed:
        print(
            "autovacuum is off on this Postgres: ANALYZE ran once after seeding "
            "(production has it on)"
        )
    errors = baseline["read_errors"] + loaded["read_errors"] + write_errors
    print(load_line())
    if errors or lost:
        print(
            "FAILED:",
            baseline["errors"] + loaded["errors"] + [e for w in writers for e in w.errors][:3],
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
