"""The project's migrations applied to a Postgres database with data while a client ingests through
the real HTTP API (a runserver process): no ingest request waits more than a second.

The rollouts app is migrated back to 0010 (the oldest state the current ingestion code can write:
0011 only changes indexes), the run is filled to FILL_ROLLOUTS realistic rollouts, and `manage.py
migrate` (a child process, as an operator runs it) applies 0011 while a thread posts batches.
As first shipped, 0011 built its five indexes with a plain CREATE INDEX in one transaction: every
score and rollout insert waited for all of them (12 s at 1M rollouts; ~2-4 s at this size here).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from bench.bulk import agent_group, fill_run
from tests.conftest import database_url_for_children

ROOT = Path(__file__).resolve().parents[2]
FILL_ROLLOUTS = 150_000  # enough that the old 0011 blocked ingestion for well over a second here
MAX_WAIT_S = 1.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL", "").startswith("postgres"),
        reason="online migrations are a Postgres matter (SQLite has one writer)",
    ),
]


def manage(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, DATABASE_URL=database_url_for_children())
    out = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def post(url: str, token: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.status, json.loads(resp.read())


class Ingester(threading.Thread):
    """Posts one batch of 4 groups x 8 rollouts after another to a run, timing each request."""

    def __init__(self, url: str, token: str, first_step: int) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.step = url, token, first_step
        self.times: list[tuple[float, float]] = []  # (start, seconds)
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.rng = random.Random(7)

    def run(self) -> None:
        while not self.stop.is_set():
            body = {"groups": [agent_group(self.step, f"k{k}", 8, self.rng) for k in range(4)]}
            t0 = time.monotonic()
            try:
                code, out = post(self.url, self.token, body)
                if code != 201 or out["rollouts"] != 32:
                    self.errors.append(f"{code} {out}")
            except Exception as e:  # noqa: BLE001 - recorded and asserted on
                self.errors.append(repr(e))
            self.times.append((t0, time.monotonic() - t0))
            self.step += 1


@contextlib.contextmanager
def search_indexes_rebuilt(cur):
    """The fill without the rollouts' GIN indexes, then each built again from its definition: the
    same database, filled in a fraction of the time (inserting 150,000 rollouts into the search
    indexes row by row took ~2 minutes of this test; a build takes seconds)."""
    cur.execute(
        "SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
        "JOIN pg_am am ON am.oid = c.relam WHERE t.relname = 'rollouts_rollout' "
        "AND am.amname = 'gin'"
    )
    indexes = cur.fetchall()
    assert indexes, "the search indexes of migration 0010"
    for name, _ in indexes:
        cur.execute(f"DROP INDEX {name}")
    yield
    for _, definition in indexes:
        cur.execute(definition)


def test_it_applies_the_migrations_with_data_while_a_client_ingests(app_server, trainer_token):
    from django.db import connection

    manage("migrate", "rollouts", "0010")
    try:
        code, created = post(
            f"{app_server.url}/api/v1/runs/",
            trainer_token,
            {
                "name": "online",
                "kind": "grpo",
                "environment": {
                    "name": "ops-env",
                    "components": [{"name": c} for c in ("correct", "format", "penalty")],
                },
            },
        )
        assert code == 201, created
        run_id = created["id"]
        rng = random.Random(1)
        groups = [agent_group(0, f"g{k}", 16, rng) for k in range(16)]
        post(f"{app_server.url}/api/v1/runs/{run_id}/groups/", trainer_token, {"groups": groups})
        with connection.cursor() as cur, search_indexes_rebuilt(cur):
            fill_run(cur, run_id, FILL_ROLLOUTS // 256)
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
        ingester = Ingester(
            f"{app_server.url}/api/v1/runs/{run_id}/groups/", trainer_token, 100_000
        )
        ingester.start()
        time.sleep(2)
        t0 = time.monotonic()
        manage("migrate")
        t1 = time.monotonic()
        time.sleep(1)
        ingester.stop.set()
        ingester.join(60)
    finally:
        manage("migrate")  # whatever happened, the test database goes back to the latest schema
    during = [s for start, s in ingester.times if t0 <= start <= t1]
    assert ingester.errors == []
    assert t1 - t0 > MAX_WAIT_S, "the migration was too quick for this test to mean anything"
    assert len(during) >= 5, ingester.times
    assert max(s for _, s in ingester.times) < MAX_WAIT_S, sorted(s for _, s in ingester.times)[-5:]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname, i.indisvalid FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname IN ('score_step', 'rollout_run_reward', 'rollout_run_adv', "
            "'rollout_run_length', 'rollout_run_step') OR c.relname LIKE '%%\\_new'"
        )
        assert sorted(cur.fetchall()) == [
            ("rollout_run_adv", True),
            ("rollout_run_length", True),
            ("rollout_run_reward", True),
            ("rollout_run_step", True),
            ("score_step", True),
        ]
        cur.execute("SELECT count(*) FROM rollouts_rollout WHERE run_id = %s", [run_id])
        assert cur.fetchone()[0] == 256 + (FILL_ROLLOUTS // 256) * 256 + 32 * len(ingester.times)
