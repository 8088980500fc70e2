"""Fixtures for tests that cross process boundaries: a real web server process on
the test database."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import database_url_for_children
from tests.training.conftest import tiny_model  # noqa: F401  # the same offline tiny model, built once per session

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """`manage.py runserver` in a child process on the test database: the whole HTTP stack (Django's
    WSGI handler, DRF, token auth, ingestion) in another process, which a test can stop and start
    again on the same address, as a real server goes down and comes back."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> None:
        env = dict(os.environ, DATABASE_URL=database_url_for_children(), PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                # --noreload: one process, so terminate() really takes the server down;
                # --skip-checks: the test process already ran Django's checks.
                [
                    sys.executable,
                    "manage.py",
                    "runserver",
                    f"127.0.0.1:{self.port}",
                    "--noreload",
                    "--skip-checks",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"runserver exited with {self.proc.returncode}:\n{self.log_path.read_text()}"
                )
            if self.answers():
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"runserver not answering after {timeout} s:\n{self.log_path.read_text()}"
        )

    def answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.url}/api/v1/runs/", timeout=2).close()
        except urllib.error.HTTPError:
            return True  # 401/403 without a token: the server is up and routing
        except OSError:
            return False
        return True

    def stop(self) -> None:
        """SIGTERM, as a supervisor stops a server; whatever request was in flight is lost."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)


@pytest.fixture
def app_server(transactional_db, tmp_path) -> Iterator[AppServer]:
    """A running server process; transactional_db so the child sees what the test commits, and the
    test sees what the child commits."""
    server = AppServer(tmp_path / "runserver.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def trainer_token(transactional_db) -> str:
    """An API token for a trainer, made the documented way (`manage.py createapitoken USER`)."""
    from django.core.management import call_command

    out = io.StringIO()
    call_command("createapitoken", "trainer-bot", stdout=out, stderr=io.StringIO())
    return out.getvalue().strip().splitlines()[-1]
