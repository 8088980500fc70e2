"""The child process of a training task: `python -m workers.job RUN_ID`.

Running the job in its own process means an OOM or a crash cannot take the Celery worker down, and a
cancel is a signal. The parent task (workers.tasks.run_job) watches the exit code.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when the worker that started it dies (a killed worker must
    not leave a job training on, unobserved). The parent may already be gone: then stop now. Under
    `accelerate launch` the parent is the launcher, not the worker: nothing to check there."""
    if "LOCAL_RANK" in os.environ:
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the reaper still fails the run
        return
    expected = os.environ.get("RD_WORKER_PID")
    if expected and os.getppid() != int(expected):
        sys.exit(3)


def main(run_id: int) -> int:
    _die_with_parent()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(var, "1")  # nothing may download at run time on these machines
    import django

    django.setup()
    from training.jobs import get_job
    from training.sinks import DiscardSink
    from webapp.runs.models import Run
    from workers.jobs import job_config, output_dir
    from workers.sinks import DatabaseSink

    def _terminate(signum, frame):  # cancel: unwind so partial batches already sent stay stored
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _terminate)
    run = Run.objects.filter(id=run_id).first()
    if run is None:  # deleted between the worker's claim and now: nothing to do, and nothing wrong
        print(f"run {run_id} no longer exists", file=sys.stderr)
        return 0
    # Under `accelerate launch` every process runs this; TRL gathers rollouts and metrics to process
    # 0, which alone writes to the run. The others run the same code with a sink that keeps nothing.
    primary = int(os.environ.get("RANK", "0") or 0) == 0
    sink = DatabaseSink(run_id) if primary else DiscardSink()
    try:
        config = job_config(run)
    except (ValueError, TypeError) as e:
        sink.log(f"invalid job config: {e}")
        print(f"invalid job config: {e}", file=sys.stderr)
        return 2
    out = output_dir(run)
    if primary:
        Run.objects.filter(id=run_id).update(
            output_dir=str(out), config={**run.config, "resolved": config.to_dict()}
        )
    sink.log(
        f"starting {run.kind} job for run {run_id} on device {getattr(config, 'device', 'auto')}"
    )
    try:
        summary = get_job(run.kind).main()(config, sink=sink)
    except KeyboardInterrupt:
        sink.log("cancelled")
        return 130
    except Exception:  # the whole traceback goes to the run; the parent marks it failed
        tb = traceback.format_exc()
        sink.log(tb)
        print(tb, file=sys.stderr)
        return 1
    if primary:
        Run.objects.filter(id=run_id).update(summary=_jsonable(summary))
    sink.log(f"finished: {summary}")
    return 0


def _jsonable(obj):
    import json

    return json.loads(json.dumps(obj, default=str))


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
