"""python manage.py delete_run RUN_ID [--reap]

Marks the run deleted and stops its job (webapp/runs/deletion.py); the workers' reaper removes its
rows in batches. --reap removes them in this process instead and prints what went.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from webapp.runs import deletion
from webapp.runs.models import Run


class Command(BaseCommand):
    help = "Delete a run: hidden and refused at once, its rows reaped in batches."

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", type=int)
        parser.add_argument("--reap", action="store_true", help="reap here and now")

    def handle(self, *args, **o) -> None:
        run = Run.objects.filter(id=o["run_id"]).first()
        if run is None:
            raise CommandError(f"run {o['run_id']}: no such run")
        if deletion.request_delete(run):
            self.stdout.write(f"run {run.id} ({run.name}) marked deleted")
        if o["reap"]:
            r = deletion.reap(run.id)
            state = "gone" if r.finished else "waiting for its job to stop"
            self.stdout.write(
                f"run {run.id}: {r.batches} batches, longest {r.longest_batch_s:.2f} s, "
                f"{r.rows}; {state}"
            )
