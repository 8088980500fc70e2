"""`manage.py export_rollouts --run NAME [--format jsonl|hf] [--out PATH] [filters]`.

jsonl: one group per line in the ingestion format (re-importable with import_rollouts --format
jsonl); stdout when --out is not given. hf: a folder that `datasets.load_dataset(folder)`
reads, one row per rollout; --sort/--order order the rows like the explorer (hf only: a JSONL
line is a whole group).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.errors import FieldError
from webapp.explorer.params import ExplorerQuery
from webapp.rollouts.exporters import GroupFilter, write_hf, write_jsonl
from webapp.runs.models import Run


class Command(BaseCommand):
    help = "Export a run's rollouts as ingestion-format JSONL or a Hugging Face datasets folder."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--run", required=True, help="run name (or id)")
        parser.add_argument("--format", choices=("jsonl", "hf"), default="jsonl")
        parser.add_argument("--out", help="file (jsonl; default stdout) or folder (hf, required)")
        parser.add_argument(
            "--sort", help="hf only: reward, advantage, length, step or a component name"
        )
        parser.add_argument("--order", choices=("asc", "desc"), default="desc")
        parser.add_argument("--step-min", type=int)
        parser.add_argument("--step-max", type=int)
        parser.add_argument("--split", choices=("train", "holdout"))
        parser.add_argument(
            "--zero-std-only", action="store_true", help="only groups whose reward has no spread"
        )

    def handle(self, *args: Any, **o: Any) -> None:
        run = self._run(o["run"])
        filters = GroupFilter(
            step_min=o["step_min"],
            step_max=o["step_max"],
            split=o["split"],
            zero_std_only=o["zero_std_only"],
        )
        if o["format"] == "jsonl":
            if o["sort"]:
                raise CommandError(
                    "--sort: JSONL exports whole groups (in id order); use --format hf to sort "
                    "rollouts"
                )
            if o["out"]:
                with open(o["out"], "w", encoding="utf-8") as f:
                    n = write_jsonl(run, f, filters)
            else:
                n = write_jsonl(run, self.stdout, filters)  # type: ignore[arg-type]  # OutputWrapper: file-like
            self.stderr.write(f"exported {n} groups")
            return
        if not o["out"]:
            raise CommandError("--out: the folder to write is required for --format hf")
        query = self._query(run, o) if o["sort"] else None
        n = write_hf(run, o["out"], filters, query)
        if n == 0:
            raise CommandError(
                "no rollouts match: nothing written (a datasets folder needs at least one row)"
            )
        self.stdout.write(f"exported {n} rollouts to {o['out']}")

    def _run(self, ref: str) -> Run:
        runs = list(Run.objects.filter(name=ref)[:2])
        if not runs and ref.isdigit():
            runs = list(Run.objects.filter(id=int(ref)))
        if not runs:
            raise CommandError(f"--run: no run named {ref!r}")
        if len(runs) > 1:
            raise CommandError(f"--run: more than one run is named {ref!r}; give its id")
        return runs[0]

    def _query(self, run: Run, o: dict[str, Any]) -> ExplorerQuery:
        params = {
            "sort": o["sort"],
            "order": o["order"],
            "step_min": o["step_min"],
            "step_max": o["step_max"],
            "split": o["split"],
            "zero_std": "1" if o["zero_std_only"] else None,
            "limit": 500,
        }
        comps = [c.name for c in run.components()]
        try:
            return ExplorerQuery.from_params(
                {k: v for k, v in params.items() if v is not None}, comps
            )
        except FieldError as e:
            raise CommandError(f"--{e.field.replace('_', '-')}: {e.message}") from None
