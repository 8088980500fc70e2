"""`python manage.py diagnose RUN [--window N|all] [--fail-on critical|warning] [--json]`

Prints a run's findings (each with the step it holds from and what to try), or the diagnosis
as JSON (the API's document). Exit status, so that a training pipeline can stop a run that
has stopped learning:
    0  no finding at the --fail-on level (always 0 without --fail-on; "not enough groups to
       judge" is 0)
    1  at least one finding at that level or worse
    2  bad input: no such run, or a bad --window
"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from webapp.diagnostics import report
from webapp.errors import FieldError
from webapp.runs.models import Run

EXIT_FINDINGS, EXIT_USAGE = 1, 2


def _run(ref: str) -> Run:
    """A run by id, else by exact name (the newest of that name)."""
    run = Run.objects.filter(id=int(ref)).first() if ref.isdigit() else None
    run = run or Run.objects.filter(name=ref).order_by("-id").first()
    if run is None:
        raise CommandError(f"RUN: no run with id or name {ref[:200]!r}", returncode=EXIT_USAGE)
    return run


class Command(BaseCommand):
    help = (
        "Diagnose a run: findings with their onset step; exit 1 on findings at the --fail-on level."
    )

    def add_arguments(self, parser):
        parser.add_argument("run", metavar="RUN", help="run id or name")
        parser.add_argument(
            "--window", default=None, help="last N steps, or 'all' (default: the page's window)"
        )
        parser.add_argument(
            "--fail-on",
            choices=["critical", "warning"],
            default=None,
            help="exit 1 when a finding of this severity or worse is present",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            dest="as_json",
            help="print the diagnosis as JSON (the API's document)",
        )

    def handle(
        self,
        *args: Any,
        run: str,
        window: str | None,
        fail_on: str | None,
        as_json: bool,
        **options: Any,
    ) -> None:
        target = _run(run)
        try:
            steps = report.parse_window(window)
        except FieldError as e:
            raise CommandError(f"--window: {e.message}", returncode=EXIT_USAGE) from None
        doc = report.run_report(target, steps)
        self.stdout.write(_json_text(doc) if as_json else _text(doc))
        if report.fails(doc, fail_on):
            sys.exit(EXIT_FINDINGS)


def _json_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, allow_nan=False)


def _text(doc: dict[str, Any]) -> str:
    window = "the whole run" if doc["window"] is None else f"the last {doc['window']} steps"
    steps = doc["steps"]
    lines = [
        f"run {doc['run']} ({doc['run_name']}): {doc['status']} over {window} "
        f"(steps {steps['min']}-{steps['max']}, {doc['n_groups']} groups, {doc['n_rollouts']} "
        "rollouts)"
    ]
    if doc["note"]:
        lines.append(f"  {doc['note']}")
    for f in doc["findings"]:
        since = f" [from step {f['onset_step']}]" if f.get("onset_step") is not None else ""
        lines += [
            f"- {f['severity'].upper()} {f['code']}{since}: {f['title']}",
            f"    try: {f['fix']}",
            f"    transcripts: {f['link']}",
        ]
    if not doc["findings"] and not doc["note"]:
        lines.append("  no problems found")
    return "\n".join(lines)
