"""Scoring a replay in workers: its chunks are the queue (webapp/leases.py).

The Celery task (workers.tasks.run_replay) calls `work`: claim a chunk (CHUNKS), score it, store
its values with its "done" mark in one transaction, repeat; the first task enqueues PARALLEL-1
copies of itself, so every free worker process joins in (no chord). Whoever finds no chunk left
claims the summary (SUMMARIES), once. A chunk or summary held past STALE_SECONDS is claimable
again; a replay nobody works on is re-queued by the workers' heartbeat (`resume_stalled`).
"""

from __future__ import annotations

import logging
import socket
import time

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from webapp.leases import LeaseQueue
from webapp.replays import results
from webapp.replays.models import Replay, ReplayChunk
from webapp.replays.scoring import Version, prepare, score_groups, write_scores

log = logging.getLogger(__name__)

STALE_SECONDS = 600  # a chunk or summary held this long by a worker that died is claimable again
RESUME_SCAN = 100  # unfinished replays looked at per heartbeat: a handful exist at a time
REPLAY_TASK = "workers.tasks.run_replay"  # sent by name: webapp never imports workers

CHUNKS = LeaseQueue(
    ReplayChunk,
    ready=(ReplayChunk.Status.PENDING,),
    held=ReplayChunk.Status.RUNNING,
    token="claimed_at",
    beat="claimed_at",  # a chunk takes seconds: nothing renews it
    holder="worker",
    stale_seconds=lambda: STALE_SECONDS,
    reclaim=True,
    order=("index",),
)
SUMMARIES = LeaseQueue(
    Replay,
    ready=(Replay.Status.RUNNING,),
    held=Replay.Status.SUMMARISING,
    token="summarising_at",
    beat="summarising_at",
    stale_seconds=lambda: STALE_SECONDS,
    reclaim=True,  # summarising twice stores the same result
)


def parallel() -> int:
    """Task copies a replay asks for: more than the worker processes only costs a
    quick empty claim."""
    return int(getattr(settings, "REPLAY_PARALLEL", 2))


def enqueue(replay: Replay) -> None:
    """Send the replay's task to the default queue once the current transaction commits."""
    from webapp.celery import app

    transaction.on_commit(lambda: app.send_task(REPLAY_TASK, args=[replay.id], queue="default"))


def claim_chunk(replay_id: int, worker: str) -> ReplayChunk | None:
    """The next pending (or stale) chunk, claimed atomically; None when there is none left."""
    return CHUNKS.claim_next(Q(replay_id=replay_id), worker)


def process_chunk(replay: Replay, chunk: ReplayChunk, versions: list[Version] | None) -> None:
    """Score and store one chunk, all or nothing. `versions` None: they failed to resolve here."""
    t0 = time.perf_counter()
    try:
        if versions is None:
            versions = prepare(replay)
        rows, failed = score_groups(replay, chunk.group_ids, versions)
        with transaction.atomic():
            if not CHUNKS.release(
                chunk,
                status=ReplayChunk.Status.DONE,
                n_failed=failed,
                seconds=time.perf_counter() - t0,
            ):
                # Declared stale and claimed by another worker meanwhile: its result
                # counts, not ours
                return
            write_scores(rows)
            Replay.objects.filter(id=replay.id).update(
                done=F("done") + chunk.n_rollouts, failed=F("failed") + failed
            )
    except Exception as e:  # a failed chunk stores nothing: the transaction above rolled back whole
        log.exception("replay %s chunk %s failed", replay.id, chunk.index)
        CHUNKS.release(
            chunk, status=ReplayChunk.Status.FAILED, error=f"{type(e).__name__}: {e}"[:2000]
        )


def work(replay_id: int, worker: str | None = None) -> str:
    """Claim and score chunks until none is left, then summarise if this process is the last one."""
    worker = worker or socket.gethostname()
    replay = Replay.objects.select_related("run", "run__environment").filter(id=replay_id).first()
    if replay is None:
        return f"replay {replay_id} no longer exists"
    Replay.objects.filter(id=replay.id, status=Replay.Status.QUEUED).update(
        status=Replay.Status.RUNNING, started_at=timezone.now()
    )
    try:
        versions: list[Version] | None = prepare(replay)
    except Exception as e:
        versions = (
            None  # every chunk fails with the reason: nothing is scored with code that is not there
        )
        log.warning("replay %s: versions do not resolve: %s", replay.id, e)
    n = 0
    while True:
        if Replay.objects.filter(id=replay.id, cancel_requested=True).exists():
            _cancel(replay)
            break
        chunk = claim_chunk(replay.id, worker)
        if chunk is None:
            break
        process_chunk(replay, chunk, versions)
        n += 1
    finish(replay.id)
    replay.refresh_from_db()
    return (
        replay.summary
        or f"replay {replay.id}: {n} chunks scored here, {replay.done}/{replay.total} rollouts"
    )


def _cancel(replay: Replay) -> None:
    live = (Replay.Status.QUEUED, Replay.Status.RUNNING)
    done = Replay.objects.get(id=replay.id).done
    Replay.objects.filter(id=replay.id, status__in=live).update(
        status=Replay.Status.CANCELLED,
        finished_at=timezone.now(),
        summary=f"cancelled after {done:,} of {replay.total:,} rollouts",
    )


def finish(replay_id: int) -> bool:
    """Summarise once every chunk is done or failed; True for the one caller that did it. A summary
    begun more than STALE_SECONDS ago (its worker died) is begun again; summarising twice stores
    the same result."""
    busy = ReplayChunk.objects.filter(
        replay_id=replay_id, status__in=[ReplayChunk.Status.PENDING, ReplayChunk.Status.RUNNING]
    )
    if busy.exists():
        return False
    if not SUMMARIES.claim_row(replay_id):
        # Another worker is summarising (not for long enough to be presumed dead), or cancelled
        return False
    replay = Replay.objects.select_related("run", "run__environment").get(id=replay_id)
    try:
        results.summarise(replay)
    except Exception as e:
        log.exception("replay %s: summary failed", replay_id)
        Replay.objects.filter(id=replay_id).update(
            status=Replay.Status.FAILED,
            finished_at=timezone.now(),
            error=f"summary failed: {type(e).__name__}: {e}"[:2000],
            summary="failed while summarising",
        )
    return True


def stalled(replay: Replay) -> bool:
    """Nobody is working on `replay` and it is not finished: every worker that held a chunk or its
    summary died (no claim or summary for STALE_SECONDS), or its tasks were lost; and it was not
    re-queued within that time either. `resume` queues it again."""
    stale = CHUNKS.stale_before()
    if replay.resumed_at and replay.resumed_at >= stale:
        return False  # already re-queued: give that task the same time a worker gets
    if replay.status == Replay.Status.SUMMARISING:
        return replay.summarising_at is None or replay.summarising_at < stale
    if replay.status != Replay.Status.RUNNING or (replay.started_at and replay.started_at >= stale):
        return False
    return not CHUNKS.live(Q(replay=replay)).exists()


def resume(replay: Replay) -> bool:
    """Queue a stalled replay again: its task reclaims the stale chunks, then the summary. False
    when it is not stalled (workers are on it, it is finished, or another caller just re-queued it:
    the claim on resumed_at is atomic, so many worker heartbeats queue one task)."""
    if not stalled(replay):
        return False
    stale = CHUNKS.stale_before()  # one re-queue per stale limit
    if not Replay.objects.filter(
        Q(resumed_at__isnull=True) | Q(resumed_at__lt=stale), id=replay.id
    ).update(resumed_at=timezone.now()):
        return False
    enqueue(replay)
    return True


def resume_stalled() -> int:
    """Re-queue every stalled replay (called by each worker's heartbeat,
    workers/tasks.py); how many."""
    live = Replay.objects.filter(status__in=[Replay.Status.RUNNING, Replay.Status.SUMMARISING])
    return sum(resume(r) for r in live.order_by("id")[:RESUME_SCAN])
