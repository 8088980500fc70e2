"""Faults injected into the real processes, each under 90 s. Only PRIVATE servers are stopped here.

(a) The training child killed mid-step: covered by
    tests/workers/test_jobs_e2e.py::test_it_fails_a_killed_job_and_keeps_its_rollouts (not
    duplicated).
(b) The Celery worker SIGKILLed (its whole process group) while a job runs: once its heartbeat
    stops, `reap_stale_runs()` fails the run; the rollouts already recorded stay.
(c) The broker (a private Redis) restarted mid-job: the job still finishes (its state is in the
    database) and the worker reconnects and runs a second job queued after the restart.
(d) A private Postgres restarted while a client streams batches through a real API server: the
    client retries, and every acknowledged batch is stored exactly once (nothing acknowledged is
    lost, nothing is duplicated).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import database_url_for_children, wait_for
from tests.reliability.conftest import Server, kill_group, manage

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT = 1  # seconds: WORKER_HEARTBEAT_SECONDS of the worker and of this process


def _start_worker(log: Path, broker: str, name: str) -> subprocess.Popen:
    env = dict(
        os.environ,
        DATABASE_URL=database_url_for_children(),
        CELERY_BROKER_URL=broker,
        WORKER_HEARTBEAT_SECONDS=str(HEARTBEAT),
        PYTHONUNBUFFERED="1",
    )
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "workers",
                "worker",
                "-Q",
                "default,gpu",
                "--pool",
                "solo",
                "--concurrency",
                "1",
                "-n",
                f"{name}-{os.getpid()}@%h",
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: "ready." in log.read_text(errors="replace") or proc.poll() is not None,
            timeout=60,
        )
    except AssertionError:
        kill_group(proc, signal.SIGKILL)
        raise
    assert proc.poll() is None, log.read_text()[-3000:]
    return proc


def _teacher_run(owner, num_prompts: int):
    from training.environments import get_environment
    from webapp.rollouts.services import create_run, environment_from_training

    env = environment_from_training(get_environment("diagram"))
    return create_run(
        name=f"fault teacher {num_prompts}",
        kind="teacher",
        environment=env,
        owner=owner,
        config={"teacher": "scripted", "num_prompts": num_prompts, "num_gpus": 1},
    )


def _enqueue(broker: str, run_id: int) -> None:
    from workers.celery import app
    from workers.tasks import run_job

    with app.connection_for_write(broker) as conn:
        run_job.apply_async(args=[run_id], queue="default", connection=conn)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _kill_orphan_child(run) -> None:
    """Clean-up only: the job child runs in its own session, so a test kills it if it
    is still there."""
    run.refresh_from_db()
    if run.pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, signal.SIGKILL)


def test_it_fails_a_run_whose_worker_was_killed_and_keeps_its_rollouts(
    transactional_db, personas, private_redis, tmp_path, settings
):
    from webapp.rollouts.models import Rollout
    from webapp.runs.models import STALE_BEATS, Run
    from webapp.runs.services import reap_stale_runs

    settings.WORKER_HEARTBEAT_SECONDS = HEARTBEAT
    worker = _start_worker(tmp_path / "worker.log", private_redis.url, "victim")
    run = _teacher_run(personas["trainer"], 4000)
    try:
        _enqueue(private_redis.url, run.id)
        wait_for(lambda: Rollout.objects.filter(run=run).count() >= 16, timeout=60, interval=0.2)
        run.refresh_from_db()
        assert run.status == "running"
        os.killpg(worker.pid, signal.SIGKILL)  # the worker and anything in its process group
        worker.wait(timeout=10)
        killed_at = time.monotonic()
        run.refresh_from_db()
        # The job child dies with its worker (PR_SET_PDEATHSIG): nothing keeps training unobserved.
        wait_for(lambda: not _alive(run.pid), timeout=20, interval=0.2)
        kept = Rollout.objects.filter(run=run).count()
        # Before the heartbeat is stale, the reaper must leave the run alone.
        assert reap_stale_runs() == 0 and Run.objects.get(id=run.id).status == "running"
        wait_for(
            lambda: reap_stale_runs() or Run.objects.get(id=run.id).status == "failed",
            timeout=HEARTBEAT * STALE_BEATS + 20,
            interval=0.5,
        )
        run.refresh_from_db()
        assert run.status == "failed" and "worker lost" in run.error
        assert time.monotonic() - killed_at < HEARTBEAT * STALE_BEATS + 20
        assert Rollout.objects.filter(run=run).count() == kept >= 16
    finally:
        kill_group(worker, signal.SIGKILL)
        _kill_orphan_child(run)


def test_it_finishes_a_job_across_a_broker_restart_and_runs_the_next_one(
    transactional_db, personas, private_redis, tmp_path
):
    from webapp.rollouts.models import Rollout
    from webapp.runs.models import Run

    log = tmp_path / "worker.log"
    worker = _start_worker(log, private_redis.url, "survivor")
    first = _teacher_run(personas["trainer"], 1500)
    try:
        _enqueue(private_redis.url, first.id)
        wait_for(lambda: Rollout.objects.filter(run=first).exists(), timeout=60, interval=0.2)
        private_redis.restart(down_seconds=2)  # no persistence: every broker-side message is gone
        first = wait_for(
            lambda: (r := Run.objects.get(id=first.id)).status in ("succeeded", "failed") and r,
            timeout=60,
            interval=0.5,
        )
        assert first.status == "succeeded", first.error
        assert Rollout.objects.filter(run=first).count() == 1500
        second = _teacher_run(personas["trainer"], 40)
        _enqueue(
            private_redis.url, second.id
        )  # after the restart: the worker must have reconnected
        second = wait_for(
            lambda: (r := Run.objects.get(id=second.id)).status in ("succeeded", "failed") and r,
            timeout=60,
            interval=0.5,
        )
        assert second.status == "succeeded", second.error
        assert worker.poll() is None
    finally:
        kill_group(worker, signal.SIGKILL)


class _Retries(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_it_stores_every_acknowledged_batch_exactly_once_across_a_postgres_restart(
    private_postgres, tmp_path
):
    import psycopg

    from tests.conftest import make_group
    from training.client import Client

    url = private_postgres.create_database("rd_fault")
    manage(url, "migrate", "--verbosity", "0", timeout=180)
    manage(
        url, "createuser", "feeder", "--role", "trainer", RD_PASSWORD="feeder-password"
    )  # never on argv
    token = re.search(r"token (\w+)", manage(url, "drf_create_token", "feeder")).group(1)
    server = Server(url, tmp_path / "server.log", DB_CONN_MAX_AGE="0")
    server.start()
    handler = _Retries()
    logging.getLogger("training.client").addHandler(handler)
    try:
        client = Client(server.url, token, timeout=10, retries=10, backoff=0.3)
        run_id = client.create_run(
            "pg restart", environment="toy", components=["correct", "format"]
        )
        batches, acked, errors = 80, [], []

        def feed() -> None:
            for b in range(batches):
                groups = [
                    make_group(
                        b, f"g{b}-{i}", [{"correct": float(j % 2), "format": 0.5} for j in range(4)]
                    )
                    for i in range(4)
                ]
                try:
                    acked.append((b, client.post_groups(run_id, groups)))
                except (
                    Exception
                ) as e:  # counted: the assertion below says what was not acknowledged
                    errors.append((b, repr(e)))

        feeder = threading.Thread(target=feed)
        feeder.start()
        wait_for(lambda: len(acked) >= 15 or not feeder.is_alive(), timeout=60, interval=0.05)
        private_postgres.restart(down_seconds=2)
        feeder.join(timeout=80)
        assert not feeder.is_alive()
        with psycopg.connect(url) as conn:
            n_groups, n_keys = conn.execute(
                "SELECT COUNT(*), COUNT(DISTINCT (step, key)) FROM rollouts_group "
                "WHERE run_id = %s",
                [run_id],
            ).fetchone()
            n_rollouts = conn.execute(
                "SELECT COUNT(*) FROM rollouts_rollout WHERE run_id = %s", [run_id]
            ).fetchone()[0]
        acked_batches = {b for b, _ in acked}
        assert not errors, errors
        assert len(acked_batches) == batches
        assert n_groups == n_keys == batches * 4  # every acknowledged group once, no duplicate
        assert n_rollouts == batches * 16
        retried = [line for line in handler.lines if "attempt" in line]
        assert retried, "the restart did not disturb the client at all: the test proved nothing"
        skipped = sum(r["skipped_groups"] for _, r in acked)
        print(
            f"\npostgres restart: {batches} batches acknowledged, {len(retried)} retried attempts, "
            f"{skipped} groups found already stored on retry, lost: 0, duplicated: 0"
        )
        assert "Traceback" not in server.log_path.read_text() or server.proc.poll() is None
    finally:
        logging.getLogger("training.client").removeHandler(handler)
        server.stop()
