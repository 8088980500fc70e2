"""Deleting a run whose job is running: the task stops the job and exits cleanly, the runs
queued behind it fail with the reason, and its output folder goes. The task runs in this process
(a thread) with a real child process standing in for the training job (training itself is not
what is tested)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import database_url_for_children, wait_for
from webapp.errors import FieldError
from webapp.rollouts.services import create_run
from webapp.runs.models import Run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fast_worker(settings, tmp_path, monkeypatch):
    import workers.tasks

    settings.WORKER_HEARTBEAT_SECONDS = 1  # the watch loop looks at the run every half second
    settings.RUNS_DIR = tmp_path / "runs"
    child = [sys.executable, "-c", "import time; time.sleep(120)"]
    monkeypatch.setattr(workers.tasks, "_child_command", lambda run: child)
    return settings.RUNS_DIR


def start_task(run_id: int) -> tuple[threading.Thread, list[object]]:
    from django.db import connection

    from workers.tasks import run_job

    out: list[object] = []

    def target() -> None:
        try:
            out.append(run_job(run_id))
        except BaseException as e:  # noqa: BLE001 - the test asserts there is none
            out.append(e)
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


def test_it_stops_the_job_and_exits_cleanly_when_its_run_is_deleted(
    transactional_db, env3, fast_worker
):
    run = create_run(name="doomed", kind="grpo", environment=env3, config={})
    child = create_run(
        name="after doomed",
        kind="eval",
        environment=env3,
        config={"start_after_parent": True},
        parent=run,
    )
    thread, out = start_task(run.id)
    running = wait_for(lambda: Run.objects.filter(id=run.id, pid__isnull=False).first(), timeout=30)
    folder = Path(running.output_dir)
    assert folder.is_dir()
    Run.objects.filter(id=run.id).delete()
    thread.join(30)
    assert not thread.is_alive()
    assert out == [f"run {run.id} was deleted while running: job stopped, output folder removed"]
    with pytest.raises(ProcessLookupError):
        os.kill(running.pid, 0)  # the job process is gone, not training on for a run nobody can see
    assert not folder.exists()
    child.refresh_from_db()
    assert child.status == "failed" and f"parent run {run.id} (doomed) was deleted" in child.error


def test_it_removes_a_finished_runs_output_folder_when_the_run_is_deleted(
    db, env3, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.RUNS_DIR = tmp_path / "runs"
    run = create_run(name="done", kind="sft", environment=env3, config={}, status="succeeded")
    folder = tmp_path / "runs" / str(run.id)
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "weights.bin").write_bytes(b"x")
    with django_capture_on_commit_callbacks(execute=True):
        run.delete()
    assert not folder.exists()


def test_it_never_removes_a_folder_outside_the_runs_folder(
    db, env3, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.RUNS_DIR = tmp_path / "runs"
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    run = create_run(name="odd", kind="sft", environment=env3, config={}, status="failed")
    Run.objects.filter(id=run.id).update(output_dir=str(elsewhere))
    with django_capture_on_commit_callbacks(execute=True):
        Run.objects.get(id=run.id).delete()
    assert elsewhere.is_dir()


def test_it_exits_the_job_process_cleanly_when_its_run_no_longer_exists(db):
    env = dict(os.environ, DATABASE_URL=database_url_for_children())
    out = subprocess.run(
        [sys.executable, "-m", "workers.job", "987654"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "run 987654 no longer exists" in out.stderr
    assert "Traceback" not in out.stderr


def test_it_refuses_a_batch_for_a_run_deleted_meanwhile(transactional_db, run):
    """A job's recorder still holds its Run object when the row goes: its next batch is an ingestion
    error (logged by the database sink), not an IntegrityError raised into the trainer."""
    from tests.conftest import make_group
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.models import Group

    Run.objects.filter(id=run.id).delete()
    with pytest.raises(FieldError) as e:
        ingest_groups(run, {"groups": [make_group(0, "late", [{"correct": 1.0}])]})
    assert e.value.errors == [{"field": "run", "error": f"run {run.id} was deleted"}]
    assert not Group.objects.filter(key="late").exists()


def test_it_answers_false_not_does_not_exist_when_a_held_run_is_gone(db, env3):
    run = create_run(name="gone", kind="grpo", environment=env3, config={})
    Run.objects.filter(id=run.id).delete()
    assert run.claim("w") is False
    assert (
        run.mark_failed("late") is False
        and run.mark_succeeded() is False
        and run.mark_cancelled() is False
    )
    run.request_cancel()  # a cancel of a run deleted meanwhile is a no-op


def test_it_ends_an_import_cleanly_when_its_run_is_deleted_mid_import(
    transactional_db, tmp_path, monkeypatch
):
    """The run goes between two batches: the import stops with a CommandError naming it,
    not a traceback."""
    import io
    import json

    from django.core.management import CommandError, call_command

    from tests.conftest import make_group
    from webapp.rollouts.management.commands import import_rollouts

    dump = tmp_path / "d.jsonl"
    dump.write_text(
        "".join(json.dumps(make_group(0, f"k{i}", [{"c": 1}])) + "\n" for i in range(6))
    )
    real = import_rollouts.ingest_groups
    calls = []

    def ingest_then_delete(run, body):
        calls.append(1)
        if len(calls) == 2:
            Run.objects.filter(id=run.id).delete()
        return real(run, body)

    monkeypatch.setattr(import_rollouts, "ingest_groups", ingest_then_delete)
    with pytest.raises(CommandError, match="was deleted"):
        call_command(
            "import_rollouts",
            str(dump),
            "--run",
            "vanishing",
            "--format",
            "jsonl",
            "--no-progress",
            "--batch-groups",
            "2",
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    assert not Run.objects.filter(name="vanishing").exists()


# ---- a real job writing while its run is deleted from the admin (issue 30) --------------------


@pytest.fixture
def slow_watch(monkeypatch):
    """The worker looks at its run every 4 s (WORKER_HEARTBEAT_SECONDS / 2): the job trains on for
    a few steps after the delete is marked, so its writes really race the delete."""
    monkeypatch.setenv("WORKER_HEARTBEAT_SECONDS", "8")


@pytest.mark.slow
@pytest.mark.broker
def test_it_deletes_a_run_from_the_admin_while_its_real_job_writes(
    slow_watch, worker_process, client_as
):
    """A GRPO job on the tiny model, run by a real Celery worker, records groups step by step; the
    admin deletes its run. Before: a 500 (ForeignKeyViolation on rollouts_group at commit), the job
    trained on, its folder stayed, the chained eval stayed queued. Now: the delete answers at once,
    the run is hidden, every batch the job sends afterwards is refused, the job is stopped, the
    chained run fails with the reason, and the reaper removes every row and the folder."""
    from tests.workers.test_jobs_e2e import TINY_GRPO, _launch
    from webapp.rollouts.models import Group
    from webapp.runs.deletion import dependents

    trainer = client_as("trainer")
    run = _launch(trainer, "grpo", **dict(TINY_GRPO, cfg_max_steps=200, cfg_log_completions=False))
    chained = create_run(
        name="eval after",
        kind="eval",
        environment=run.environment,
        config={"start_after_parent": True},
        parent=run,
    )
    wait_for(lambda: Group.objects.filter(run_id=run.id).count() >= 4, timeout=400, interval=0.5)
    run.refresh_from_db()
    pid, folder, step_at_delete = run.pid, Path(run.output_dir), run.current_step
    assert pid and folder.is_dir()

    res = client_as("admin").post(f"/admin/runs/run/{run.id}/delete/", {"post": "yes"})
    assert res.status_code == 302
    groups_at_delete = Group.objects.filter(run_id=run.id).count()
    assert trainer.get(f"/runs/{run.id}/").status_code == 404
    chained.refresh_from_db()
    assert chained.status == "failed"
    assert f"its parent run {run.id} ({run.name}) was deleted" in chained.error

    # The job trains on until its worker's next look; what it records meanwhile is refused.
    def refused_while_training() -> bool:
        row = Run.objects.filter(id=run.id).values_list("current_step", "log_tail").first()
        return bool(row) and row[0] > step_at_delete and f"run {run.id} was deleted" in row[1]

    wait_for(refused_while_training, timeout=60, interval=0.2)
    assert Group.objects.filter(run_id=run.id).count() <= groups_at_delete

    wait_for(lambda: not Run.objects.filter(id=run.id).exists(), timeout=180, interval=0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not folder.exists()
    for model, fk in dependents():
        assert not model._base_manager.filter(**{fk: run.id}).exists(), model
    log = worker_process.read_text(errors="replace")
    assert "ForeignKeyViolation" not in log and "IntegrityError" not in log
    assert f"run {run.id} reaped" in log
