"""python manage.py retain_transcripts --older-than-days 90 [--sample-percent 5] [--dry-run]

Keeps whole transcripts of finished runs older than N days only for annotated (queued, dataset)
rollouts and a fixed sample; the rest keep their numbers and previews (webapp/runs/retention.py).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from webapp.runs import retention


class Command(BaseCommand):
    help = "Drop the transcripts of old runs' rollouts that nobody annotated, keeping a sample."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--older-than-days", type=int, required=True)
        parser.add_argument("--sample-percent", type=float, default=5.0)
        parser.add_argument(
            "--dry-run", action="store_true", help="say what would go; change nothing"
        )

    def handle(self, *args, **o) -> None:
        if o["older_than_days"] < 1:
            raise CommandError("--older-than-days: must be at least 1")
        if not 0 <= o["sample_percent"] <= 100:
            raise CommandError("--sample-percent: must be between 0 and 100")
        verb = "would remove" if o["dry_run"] else "removed"
        total, nbytes = 0, 0
        for run in retention.old_runs(o["older_than_days"]):
            p = retention.retain(run, o["sample_percent"], o["dry_run"])
            total, nbytes = total + p.prune, nbytes + p.text_bytes
            layers = "".join(f", {n} {label} rows" for label, n in sorted(p.layers.items()) if n)
            self.stdout.write(
                f"run {p.run_id} ({p.name}): {verb} {p.prune} of {p.rollouts} transcripts"
                f"{layers} ({p.text_bytes / 1e6:.1f} MB of text); kept {p.kept_used} annotated, "
                f"{p.kept_sample} sampled; {p.already} already removed"
            )
        self.stdout.write(f"{verb} {total} transcripts ({nbytes / 1e6:.1f} MB of stored text)")
