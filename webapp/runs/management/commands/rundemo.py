"""`make demo`: migrate, seed, queue the tiny-model chain, start a worker and the web server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from webapp.runs.launch import queue_demo_chain


class Command(BaseCommand):
    help = (
        "Run the whole demo on embedded defaults (SQLite, filesystem broker, tiny offline model)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000")
        parser.add_argument(
            "--no-training", action="store_true", help="skip queueing the SFT -> GRPO -> eval chain"
        )

    def handle(self, *args, addr: str, no_training: bool, **options):
        call_command("migrate", interactive=False, verbosity=0)
        call_command("seed_demo")
        if not no_training:
            for line in queue_demo_chain():
                self.stdout.write(line)
        root = Path(settings.BASE_DIR)
        log = Path(settings.VAR_DIR) / "worker.log"
        with open(log, "ab") as fh:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "workers",
                    "worker",
                    "-Q",
                    "default,gpu",
                    "--pool",
                    "solo",
                    "-n",
                    "demo@%h",
                    "--loglevel",
                    "INFO",
                ],
                cwd=root,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(os.environ),
            )
        self.stdout.write(f"worker started (pid {worker.pid}), log: {log}")
        self.stdout.write(
            self.style.SUCCESS(f"open http://{addr}/  (log in as demo / demo-password)")
        )
        # SIGTERM (a supervisor, `timeout`) must also stop the worker: turn it into SystemExit so
        # the finally clause runs, as it does for Ctrl-C.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            call_command("runserver", addr, use_reloader=False)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGTERM)
