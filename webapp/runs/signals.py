"""What deleting a run does beyond the database's cascade (admin, shell and queryset deletes alike).

- Runs queued behind it (its children: chained jobs, ablation twins) are failed with the reason: the
  parent foreign key becomes NULL on delete, so after the delete nothing could tell them why.
- Its output folder goes, once the delete commits. A running job's folder is the worker's to remove:
  the job child may still be writing there until the worker has stopped it (workers.tasks.run_job).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models.signals import pre_delete
from django.dispatch import receiver

from webapp.runs.models import Run


@receiver(pre_delete, sender=Run, dispatch_uid="runs-fail-children-and-remove-output")
def _before_run_delete(sender: type[Run], instance: Run, **kwargs) -> None:
    for child in Run.objects.filter(parent_id=instance.id, status=Run.Status.QUEUED):
        child.mark_failed(
            f"not started: its parent run {instance.id} ({instance.name}) was deleted"
        )
    if instance.status != Run.Status.RUNNING:
        folder = output_folder(instance)
        transaction.on_commit(lambda: remove_output(folder))


def output_folder(run: Run) -> Path:
    """Where the run's files are: the folder its job recorded, else the default under RUNS_DIR."""
    return Path(run.output_dir) if run.output_dir else Path(settings.RUNS_DIR) / str(run.id)


def remove_output(folder: Path) -> None:
    """Remove a run's output folder; only ever one inside RUNS_DIR (output_dir is
    a database value)."""
    root = Path(settings.RUNS_DIR).resolve()
    target = folder.resolve()
    if target.parent == root and target.is_dir():
        shutil.rmtree(target, ignore_errors=True)
