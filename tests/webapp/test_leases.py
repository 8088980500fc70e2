"""The one lease queue (webapp/leases.py) as its users hold it: replay chunks, replay summaries and
job runs. The concurrency case needs Postgres (DATABASE_URL=postgres://...), where claims use
SELECT ... FOR UPDATE SKIP LOCKED; on SQLite it is skipped (one writer at a time)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from tests.webapp import replay_fixtures as fx
from webapp.leases import LeaseQueue

HOUR_AGO = timedelta(hours=1)


def _replay_with_chunks(run, n: int):
    """A replay of `run` with `n` pending chunks (no groups: only the queue is under test)."""
    from webapp.replays.models import Replay, ReplayChunk

    replay = Replay.objects.create(run=run, name="leases", versions=[], status="running")
    ReplayChunk.objects.bulk_create(
        [ReplayChunk(replay=replay, index=i, group_ids=[]) for i in range(n)]
    )
    return replay


def _running_run(owner):
    from webapp.runs.models import Run

    run = fx.diagram_run(owner, status="queued")
    assert run.claim("worker-a") and run.status == Run.Status.RUNNING
    return run


@pytest.mark.django_db
def test_it_reclaims_a_stale_chunk_and_reaps_a_stale_run_through_one_lease_module(personas):
    from webapp.replays import queue
    from webapp.replays.models import ReplayChunk
    from webapp.runs.models import RUN_LEASES, Run
    from webapp.runs.services import reap_stale_runs

    assert all(isinstance(q, LeaseQueue) for q in (queue.CHUNKS, queue.SUMMARIES, RUN_LEASES))
    run = _running_run(personas["trainer"])
    replay = _replay_with_chunks(run, 1)
    dead = queue.claim_chunk(replay.id, "worker-that-died")
    assert queue.claim_chunk(replay.id, "w2") is None
    assert not queue.CHUNKS.stale(Q(replay=replay)).exists() and not RUN_LEASES.stale().exists()

    ReplayChunk.objects.filter(id=dead.id).update(claimed_at=timezone.now() - HOUR_AGO)
    Run.objects.filter(id=run.id).update(heartbeat_at=timezone.now() - HOUR_AGO)
    assert list(queue.CHUNKS.stale(Q(replay=replay))) == [dead]
    assert list(RUN_LEASES.stale()) == [run]

    again = queue.claim_chunk(replay.id, "w2")  # a chunk queue reclaims its stale rows
    assert again.id == dead.id and again.worker == "w2" and again.claimed_at > dead.claimed_at
    assert reap_stale_runs() == 1  # a run's stale lease is failed, never handed out again
    run.refresh_from_db()
    assert run.status == "failed" and "worker lost" in run.error and not run.claim("w3")


@pytest.mark.django_db
def test_it_lets_only_the_current_holder_renew_and_release(personas):
    from webapp.replays import queue
    from webapp.replays.models import ReplayChunk
    from webapp.runs.models import RUN_LEASES, Run

    replay = _replay_with_chunks(fx.diagram_run(personas["trainer"]), 1)
    late = queue.claim_chunk(replay.id, "late")
    ReplayChunk.objects.filter(id=late.id).update(claimed_at=late.claimed_at - HOUR_AGO)
    late.claimed_at -= HOUR_AGO
    current = queue.claim_chunk(replay.id, "current")
    assert not queue.CHUNKS.renew(late) and not queue.CHUNKS.release(late, status="done")
    assert queue.CHUNKS.renew(current) and queue.CHUNKS.release(current, status="done")
    assert ReplayChunk.objects.get(id=current.id).status == "done"
    assert not queue.CHUNKS.release(current, status="failed")  # released: no longer held

    run = _running_run(personas["trainer"])
    Run.objects.filter(id=run.id).update(heartbeat_at=timezone.now() - HOUR_AGO)
    assert RUN_LEASES.renew(run) and not RUN_LEASES.stale().exists()
    Run.objects.filter(id=run.id).delete()
    assert not RUN_LEASES.renew(run)  # the worker's watch loop stops its job then


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_hands_each_chunk_to_one_of_two_concurrent_claimers(personas):
    """Two workers claim from one replay at once, each on its own connection: every chunk is
    claimed exactly once, and a chunk locked by one claimer is skipped by the other, not waited
    for (SKIP LOCKED)."""
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    from webapp.replays import queue
    from webapp.replays.models import ReplayChunk

    replay = _replay_with_chunks(fx.diagram_run(personas["trainer"]), 200)
    start = threading.Barrier(2)
    claimed: dict[str, list[int]] = {"a": [], "b": []}
    errors: list[BaseException] = []

    def claimer(name: str) -> None:
        try:
            start.wait(10)
            while (chunk := queue.claim_chunk(replay.id, name)) is not None:
                claimed[name].append(chunk.index)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors.append(e)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    both = claimed["a"] + claimed["b"]
    assert sorted(both) == list(range(200)) and claimed["a"] and claimed["b"]
    by_worker = dict(ReplayChunk.objects.filter(replay=replay).values_list("index", "worker"))
    assert all(by_worker[i] == n for n, indexes in claimed.items() for i in indexes)

    # A claimer holding the first pending chunk's row lock: the other takes the next one at once.
    other = _replay_with_chunks(replay.run, 2)
    locked, taken = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                ReplayChunk.objects.select_for_update().get(replay=other, index=0)
                locked.set()
                taken.wait(30)
        finally:
            connection.close()

    t = threading.Thread(target=holder)
    t.start()
    assert locked.wait(30)
    try:
        assert queue.claim_chunk(other.id, "c").index == 1
    finally:
        taken.set()
        t.join(30)
    assert queue.claim_chunk(other.id, "c").index == 0
