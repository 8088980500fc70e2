"""Celery tasks. Each takes ids, treats a missing row as a clean exit, and returns
a one-line summary."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from celery.signals import worker_ready, worker_shutdown

from workers.celery import app

log = logging.getLogger(__name__)
CANCEL_GRACE_SECONDS = 20  # after SIGTERM, the child gets this long to unwind before SIGKILL
LOG_TAIL_BYTES = 4000
REAP_BUDGET_SECONDS = 300
REAP_SWEEP_BEATS = 6  # every this many heartbeats, a worker re-queues the reaper of deleted runs


def child_env() -> dict[str, str]:
    """The job child's environment: the worker's, unbuffered, with its pid (the child
    exits with it).

    OMP_WAIT_POLICY=PASSIVE unless set: by default torch's OpenMP threads spin-wait for each other,
    and on a CPU box where anything else runs (the web server, Postgres, a second job) a spinning
    thread holds the core its sibling needs. Measured on the 2-core dev machine under load: 15
    training steps of the tiny model took 21 s with the default policy, 4.6 s with PASSIVE, 5.9 s
    with one thread."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", RD_WORKER_PID=str(os.getpid()))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


@app.task(name="workers.tasks.recompute_run_stats", queue="default")
def recompute_run_stats(run_id: int) -> str:
    from webapp.rollouts.services import recompute_run_stats as recompute
    from webapp.runs.models import Run

    try:
        run = Run.objects.get(id=run_id)
    except Run.DoesNotExist:
        return f"run {run_id} no longer exists"
    out = recompute(run)
    return f"run {run_id}: recomputed {out['groups']} groups, {out['rollouts']} rollouts"


@app.task(name="workers.tasks.update_behaviours", queue="default")
def update_behaviours(run_id: int) -> str:
    """The run's behaviours brought up to date on its new steps (webapp/behaviours)."""
    from webapp.behaviours.services import update_run
    from webapp.runs.models import Run

    try:
        run = Run.objects.get(id=run_id)
    except Run.DoesNotExist:
        return f"run {run_id} no longer exists"
    out = update_run(run)
    return f"run {run_id}: " + (", ".join(f"{k}: {v}" for k, v in out.items()) or "no behaviours")


def _child_command(run, gpus_here: int | None = None) -> list[str]:
    """`python -m workers.job RUN_ID`, under `accelerate launch --multi_gpu` (TRL's own
    multi-GPU path, one process per GPU) when the run asks for several GPUs. A ValueError names
    what is missing: accelerate on a host without enough GPUs would fall back to ONE process
    without a word."""
    from training.jobs import runs_on_several_gpus
    from webapp.runs.services import visible_gpus

    gpus = int((run.config or {}).get("num_gpus", 1) or 1)
    job = ["-m", "workers.job", str(run.id)]
    if gpus <= 1:
        return [sys.executable, *job]
    if not runs_on_several_gpus(run.kind):
        raise ValueError(
            f"num_gpus: only SFT, GRPO and DPO jobs run on several GPUs, not {run.kind}"
        )
    available = visible_gpus() if gpus_here is None else gpus_here
    if available < gpus:
        raise ValueError(f"num_gpus: the job asks for {gpus} GPUs, this worker has {available}")
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_machines",
        "1",
        "--num_processes",
        str(gpus),
        "--main_process_port",
        str(_free_port()),
        *job,
    ]


def _free_port() -> int:
    """A port for the job's process group: several multi-GPU jobs on one host (one worker per GPU
    set) must not all rendezvous on torch's default 29500."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


@app.task(name="workers.tasks.run_job", bind=True, acks_late=True)
def run_job(self, run_id: int) -> str:
    """Claim the run, run its job in a child process, relay cancel, record how it ended.

    No retry: a training error fails the run. Transient broker trouble is Celery's to retry.
    """
    from django.db import close_old_connections

    from webapp.runs.models import Run
    from workers.jobs import output_dir

    close_old_connections()
    try:
        run = Run.objects.get(id=run_id)
    except Run.DoesNotExist:
        return f"run {run_id} no longer exists"
    worker = self.request.hostname or socket.gethostname()
    if not run.claim(worker):
        return f"run {run_id} not claimed (status {run.status})"
    out = output_dir(run)
    out.mkdir(parents=True, exist_ok=True)
    child_log = out / "job.log"
    try:
        command = _child_command(run)
    except ValueError as e:
        run.mark_failed(str(e))
        _after(run)
        return f"run {run_id} failed ({e})"
    with open(child_log, "ab") as fh:
        proc = subprocess.Popen(
            command,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[1],
            env=child_env(),
        )
    Run.objects.filter(id=run_id).update(pid=proc.pid, output_dir=str(out))
    _set_current(run_id)
    rc = _watch(run, proc)
    _set_current(None)
    if not Run.objects.filter(id=run_id, deleted_at__isnull=True).exists():
        return _deleted(run, out)
    run.refresh_from_db()
    if run.cancel_requested:
        run.mark_cancelled()
        outcome = "cancelled"
    elif rc == 0:
        run.mark_succeeded()
        outcome = "succeeded"
    else:
        why = (
            f"killed by signal {-rc}" + (" (out of memory?)" if rc == -signal.SIGKILL else "")
            if rc < 0
            else f"exit code {rc}"
        )
        run.mark_failed(f"job process {why}\n{_tail(child_log)}")
        outcome = f"failed ({why})"
    _after(run)
    return f"run {run_id} {outcome}"


def _watch(run, proc: subprocess.Popen) -> int:
    from django.conf import settings

    from webapp.runs.models import RUN_LEASES, Run

    term_at: float | None = None
    last_beat = 0.0
    while True:
        rc = proc.poll()
        if rc is not None:
            return rc
        now = time.monotonic()
        if now - last_beat >= settings.WORKER_HEARTBEAT_SECONDS / 2:
            alive = RUN_LEASES.renew(run)
            last_beat = now
            stop = (
                not alive or Run.objects.filter(id=run.id, cancel_requested=True).exists()
            )  # deleted or cancel
            if term_at is None and stop:
                _signal(proc, signal.SIGTERM)
                term_at = now
        if term_at is not None and now - term_at > CANCEL_GRACE_SECONDS:
            _signal(proc, signal.SIGKILL)
        time.sleep(0.5)


def _deleted(run, out: Path) -> str:
    """The run was deleted while its job ran (marked by webapp.runs.deletion, or its row removed):
    the job is stopped (see _watch), the run ends cancelled, its folder goes, and the reaper is
    queued to remove its rows. Its queued children were failed by the delete itself."""
    from webapp.runs.signals import remove_output

    run.mark_cancelled()  # a no-op when the row is gone
    remove_output(out)
    reap_deleted_run.delay(run.id)
    return f"run {run.id} was deleted while running: job stopped, output folder removed"


@app.task(name="workers.tasks.reap_deleted_run", queue="default")
def reap_deleted_run(run_id: int) -> str:
    """Remove a run marked deleted, in batches (webapp/runs/deletion.py). Re-queues itself after
    REAP_BUDGET_SECONDS so one huge run does not hold a worker process for an hour."""
    from django.db import close_old_connections

    from webapp.runs.deletion import reap

    close_old_connections()
    report = reap(run_id, budget_s=REAP_BUDGET_SECONDS)
    if report.finished:
        return f"run {run_id} reaped: {report.rows}"
    if report.waiting_for_job:
        return f"run {run_id}: rows reaped, waiting for its job to stop"
    if report.batches:
        reap_deleted_run.delay(run_id)
        return f"run {run_id}: {report.batches} batches reaped, continuing"
    return f"run {run_id}: another reaper holds it, or it is not marked deleted"


def _signal(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _after(run) -> None:
    """Chains: a finished run starts (or fails) the runs queued behind it. A run failed here never
    runs, so nothing would call this for it: the failure goes down the whole chain now."""
    from webapp.runs.launch import enqueue_run

    waiting = type(run).objects.filter(parent=run, status="queued", config__start_after_parent=True)
    for child in waiting:
        if run.status == "succeeded":
            enqueue_run(child.id)
        elif child.mark_failed(f"not started: parent run {run.id} {run.status}"):
            _after(child)


# ---- worker heartbeat ----------------------------------------------------------------------------

_current_run: int | None = None
_stop = threading.Event()


def _set_current(run_id: int | None) -> None:
    global _current_run
    _current_run = run_id


def _beat(name: str, queues: str) -> None:
    from django.conf import settings
    from django.db import close_old_connections
    from django.utils import timezone

    from webapp.replays.services import resume_stalled
    from webapp.runs.models import WorkerHeartbeat
    from webapp.runs.services import device_name, reap_stale_runs

    device = device_name()
    beats = 0
    while not _stop.is_set():
        try:
            close_old_connections()
            WorkerHeartbeat.objects.update_or_create(
                name=name,
                defaults={
                    "device": device,
                    "queues": queues,
                    "pid": os.getpid(),
                    "current_run_id": _current_run,
                    "last_seen": timezone.now(),
                },
            )
            reap_stale_runs()
            resume_stalled()  # reward replays whose workers died: re-queued once per stale limit
            if beats % REAP_SWEEP_BEATS == 0:
                _sweep_deleted()
            beats += 1
        except Exception:  # the database may be restarting; the next beat tries again
            log.exception("heartbeat failed")
        _stop.wait(settings.WORKER_HEARTBEAT_SECONDS)


def _sweep_deleted() -> None:
    """Queue the reaper of every run still marked deleted (its first task may have been lost with
    a broker or worker restart); a second reaper of one run returns at once."""
    from webapp.runs.deletion import pending

    for run_id in pending():
        reap_deleted_run.delay(run_id)


@worker_ready.connect
def _start_heartbeat(sender=None, **kwargs) -> None:
    name = getattr(sender, "hostname", None) or socket.gethostname()
    queues = (
        ",".join(q.name for q in getattr(getattr(sender, "app", app).amqp, "queues", {}).values())
        if hasattr(sender, "app")
        else ""
    )
    threading.Thread(target=_beat, args=(name, queues), daemon=True, name="heartbeat").start()


@worker_shutdown.connect
def _stop_heartbeat(**kwargs) -> None:
    _stop.set()


@app.task(name="workers.tasks.run_replay", bind=True, queue="default")
def run_replay(self, replay_id: int, spawn: bool = True) -> str:
    """Score a reward replay's chunks until none is left (webapp/replays/queue.py).
    The first copy queues more, so every free worker process claims chunks too; the last
    one out summarises."""
    from django.db import close_old_connections

    from webapp.replays import services

    close_old_connections()
    if spawn:
        for _ in range(services.parallel() - 1):
            run_replay.delay(replay_id, spawn=False)
    return services.work(replay_id, self.request.hostname or socket.gethostname())
