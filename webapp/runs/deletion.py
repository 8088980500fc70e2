"""Deleting a run without stopping anyone else, in three steps: `request_delete(run)` marks it
deleted under the run's ingest lock (the batches in flight finish, later ones are refused); its
worker stops the job; `reap(run_id)`, a worker task, deletes the dependent rows in short batches
found from the model graph, then the run row. A cascade in one transaction locked tens of
millions of rows for minutes and lost races with the run's own job. The full account:
docs/operations.md, "Deleting a run" and "Module notes".
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.db import connection, models, router, transaction
from django.db.models.deletion import Collector
from django.utils import timezone

from webapp.errors import FieldError
from webapp.runs.models import Run

log = logging.getLogger(__name__)

INGEST_LOCK = 30_030  # advisory lock class: (INGEST_LOCK, run id); REAP_LOCK for the reaper
REAP_LOCK = 30_031
BATCH_SECONDS = 0.25  # each reaping transaction aims at this long: short locks, steady progress
FIRST_BATCH, MIN_BATCH, MAX_BATCH = 10, 1, 20_000  # rows of the parent model per transaction


def _postgres() -> bool:
    return connection.vendor == "postgresql"


def hold_for_ingest(run_id: int) -> None:
    """In an ingestion transaction, before it writes: wait for a delete being marked, then refuse a
    run marked deleted (or gone). The shared lock is held until the batch commits."""
    with connection.cursor() as cur:
        if _postgres():
            cur.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", [INGEST_LOCK, run_id])
        # A new statement, so a new snapshot: it sees a deletion committed while we waited.
        cur.execute("SELECT deleted_at FROM runs_run WHERE id = %s", [run_id])
        row = cur.fetchone()
    if row is None or row[0] is not None:
        raise FieldError("run", f"run {run_id} was deleted")


def request_delete(run: Run) -> bool:
    """Mark `run` deleted and stop everything that writes to it; the reaper removes it later.
    False when it was already marked (or is gone)."""
    with transaction.atomic():
        if _postgres():
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", [INGEST_LOCK, run.id])
        now = timezone.now()
        n = Run.objects.filter(id=run.id, deleted_at__isnull=True).update(
            deleted_at=now, cancel_requested=True
        )
        if n == 0:
            return False
        Run.objects.filter(id=run.id, status=Run.Status.QUEUED).update(
            status=Run.Status.CANCELLED, finished_at=now
        )
        fail_children(run)
        transaction.on_commit(lambda: queue_reap(run.id))
    log.info("run %s (%s) marked deleted", run.id, run.name)
    return True


def fail_children(run: Run) -> None:
    """The runs queued behind `run` (chained jobs, ablation twins) fail with the reason."""
    for child in Run.objects.filter(parent_id=run.id, status=Run.Status.QUEUED):
        child.mark_failed(f"not started: its parent run {run.id} ({run.name}) was deleted")


def queue_reap(run_id: int) -> None:
    """Queue the reaper by name (webapp never imports workers)."""
    from webapp.celery import app

    try:
        app.send_task("workers.tasks.reap_deleted_run", args=[run_id], queue="default")
    except Exception:  # the broker may be down: every worker's heartbeat queues it again
        log.exception("could not queue the reaper for run %s", run_id)


def pending() -> list[int]:
    """Runs marked deleted and not yet reaped."""
    return list(Run.objects.filter(deleted_at__isnull=False).values_list("id", flat=True))


@dataclass
class ReapReport:
    run_id: int
    rows: dict[str, int] = field(default_factory=dict)  # model label -> rows deleted (top level)
    batches: int = 0
    longest_batch_s: float = 0.0
    finished: bool = False  # the run row is gone
    waiting_for_job: bool = False


def dependents(model: type[models.Model] = Run) -> list[tuple[type[models.Model], str]]:
    """(model, field name) of every model with a cascading foreign key to `model`."""
    return sorted(
        (
            (rel.related_model, rel.field.name)
            # What Django's Collector follows, hidden relations (related_name="+") included.
            for rel in model._meta.get_fields(include_hidden=True)
            if rel.auto_created
            and not rel.concrete
            and (rel.one_to_one or rel.one_to_many)
            and rel.on_delete is models.CASCADE
            and rel.related_model is not model
        ),
        key=lambda r: r[0]._meta.label,
    )


def top_dependents(model: type[models.Model] = Run) -> list[tuple[type[models.Model], str]]:
    """The dependents whose rows are not all reached by a cascade from another dependent: Rollout
    (which also points at its run) goes with its Group, RewardScore with its Rollout; a batch of
    groups takes everything below them."""
    rels = dependents(model)
    found = {m for m, _ in rels}

    def reached(m: type[models.Model]) -> bool:
        return any(
            f.is_relation
            and f.many_to_one
            and not f.null
            and f.related_model in found - {m}
            and f.remote_field.on_delete is models.CASCADE
            for f in m._meta.concrete_fields
        )

    return [(m, f) for m, f in rels if not reached(m)]


def reap(run_id: int, budget_s: float | None = None, pause_s: float = 0.0) -> ReapReport:
    """Delete a run marked deleted: its dependents in batches, then (its job stopped) the run row
    and its output folder. Idempotent; two reapers of one run on Postgres: the second returns at
    once. `budget_s`: stop after about this long (the task re-queues itself); `pause_s`: sleep
    between batches (gives way to other writers on a busy disk)."""
    report = ReapReport(run_id)
    run = Run.objects.filter(id=run_id, deleted_at__isnull=False).first()
    if run is None:
        report.finished = not Run.objects.filter(id=run_id).exists()
        return report
    with _reap_lock(run_id) as mine:
        if not mine:
            return report
        started = time.monotonic()
        for model, fk in top_dependents():
            if not _delete_batches(model, fk, run_id, report, started, budget_s, pause_s):
                return report
        _analyze(dependents())
        run.refresh_from_db()
        if run.status == Run.Status.RUNNING and run.kind != Run.Kind.IMPORT:
            report.waiting_for_job = True  # its worker stops the job, then queues us again
            return report
        _finish(run, report)
    return report


def _analyze(rels: list[tuple[type[models.Model], str]]) -> None:
    """Fresh planner statistics before the run row's own cascade: it deletes from each dependent
    table by run, and statistics that still count the run's million rows would plan a scan of the
    whole table for what is now nothing."""
    if not _postgres() or connection.in_atomic_block:
        return
    with connection.cursor() as cur:
        for table in sorted({m._meta.db_table for m, _ in rels}):
            cur.execute(f"ANALYZE {connection.ops.quote_name(table)}")


def _finish(run: Run, report: ReapReport) -> None:
    from webapp.runs.signals import output_folder, remove_output

    folder, run_id = output_folder(run), run.id
    with transaction.atomic():
        # Rows written since the batches (a metric, a late log line) go with the run row.
        run.delete()
    remove_output(folder)
    report.finished = True
    log.info("run %s reaped: %s", run_id, report.rows)


def _delete_batches(model, fk, run_id, report, started, budget_s, pause_s) -> bool:
    """Delete `model`'s rows of the run, batch after batch; False when the budget ran out."""
    using = router.db_for_write(model)
    size = FIRST_BATCH
    label = model._meta.label
    while True:
        if budget_s is not None and time.monotonic() - started > budget_s:
            return False
        t0 = time.monotonic()
        with transaction.atomic(using=using):
            # Unordered, so the run's own index finds them (entries of rows deleted by earlier
            # batches are marked dead on first visit and cost little after).
            ids = list(
                model._base_manager.using(using)
                .filter(**{fk: run_id})
                .values_list("pk", flat=True)[:size]
            )
            if not ids:
                return True
            collector = Collector(using=using, origin=model)
            collector.collect(model._base_manager.using(using).filter(pk__in=ids))
            collector.delete()
        dt = time.monotonic() - t0
        report.rows[label] = report.rows.get(label, 0) + len(ids)
        report.batches += 1
        report.longest_batch_s = max(report.longest_batch_s, dt)
        size = _next_size(size, dt)
        if pause_s:
            time.sleep(pause_s)


def _next_size(size: int, seconds: float) -> int:
    if seconds < BATCH_SECONDS / 2:
        return min(MAX_BATCH, size * 2)
    if seconds > BATCH_SECONDS * 2:
        return max(MIN_BATCH, size // 2)
    return size


class _reap_lock:
    """A session advisory try-lock (Postgres): one reaper per run at a time."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.held = False

    def __enter__(self) -> bool:
        if not _postgres():
            return True
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s, %s)", [REAP_LOCK, self.run_id])
            self.held = cur.fetchone()[0]
        return self.held

    def __exit__(self, *exc) -> None:
        if self.held:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s, %s)", [REAP_LOCK, self.run_id])
