"""CPU and queries of one explorer API read, in-process (no server, no network).

    DATABASE_URL=postgres://... python bench/api_read.py [--rollouts 20000] [--reads 300]

Seeds a run of one-line rollouts (bench/pages.py's shapes, through ingest_groups; reused when
already there), then reads GET /api/v1/runs/<id>/rollouts/?sort=<component>&cursor=... through the
test client with a token, paging up to 5 pages per sort like bench/load.py's readers. Prints the
queries of one read and the process CPU (time.process_time: Django, DRF, psycopg; not Postgres's)
per read, and the CPU of the Postgres backend that served them, with the load average beside it.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import COMPONENT_NAMES, report, setup_django  # noqa: E402
from bench.pages import seed  # noqa: E402


def backend_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of the Postgres backend serving this process (same host); 0.0
    where /proc cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reads(client, run_id: int, n: int, rng: random.Random) -> list[str]:
    """n reads as bench/load.py's readers make them; returns the URLs read (for the query count)."""
    urls: list[str] = []
    names = list(COMPONENT_NAMES)
    while len(urls) < n:
        sort, order, cursor = rng.choice(names), rng.choice(["asc", "desc"]), None
        for _ in range(5):
            params = {"sort": sort, "order": order, "limit": 50}
            if cursor:
                params["cursor"] = cursor
            res = client.get(f"/api/v1/runs/{run_id}/rollouts/", params)
            assert res.status_code == 200, res.content[:300]
            urls.append(res.request["QUERY_STRING"])
            cursor = res.json()["next"]
            if not cursor or len(urls) >= n:
                break
    return urls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=20_000)
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    setup_django()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from webapp.accounts.roles import set_role

    run = seed(args.rollouts)
    user, _ = get_user_model().objects.get_or_create(username="bench-api-viewer")
    set_role(user, "viewer")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    rng = random.Random(0)
    reads(client, run.id, 20, rng)  # warm-up: imports, URL resolver, connection
    counts = []
    for url in reads(client, run.id, 50, random.Random(1)):
        with CaptureQueriesContext(connection) as ctx:
            client.get(f"/api/v1/runs/{run.id}/rollouts/?{url}")
        counts.append(len(ctx.captured_queries))
    print(
        f"queries per read: mean {statistics.mean(counts):.2f}, "
        f"min {min(counts)}, max {max(counts)} (50 reads)"
    )
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    per_read = []
    for _ in range(args.rounds):
        t0, pg0 = time.process_time(), backend_cpu_seconds(backend)
        reads(client, run.id, args.reads, rng)
        per_read.append((time.process_time() - t0) * 1000 / args.reads)
        pg = (backend_cpu_seconds(backend) - pg0) * 1000 / args.reads
        report(f"CPU ms per read: {per_read[-1]:.2f}, Postgres {pg:.2f}")
    print(f"median CPU ms per read: {statistics.median(per_read):.2f}")


if __name__ == "__main__":
    main()
