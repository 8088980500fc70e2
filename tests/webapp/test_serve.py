"""The production server starts from the documented command (`make serve`) and serves
the login page."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.urls import reverse

from tests.conftest import database_url_for_children

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    env = dict(
        os.environ,
        DATABASE_URL=database_url_for_children(),
        DEBUG="0",
        SECURE_SSL_REDIRECT="0",
        SECRET_KEY="test-serve-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz",
    )
    log = tmp_path / "serve.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            ["make", "serve", f"BIND=127.0.0.1:{port}", "WORKERS=2"],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, log


def _get(url: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return None


def test_it_serves_the_login_page_from_make_serve(tmp_path):
    port = _free_port()
    proc, log = _serve(port, tmp_path)
    try:
        deadline, got = time.time() + 180, None
        while time.time() < deadline and proc.poll() is None:
            got = _get(f"http://127.0.0.1:{port}{reverse('accounts-login')}")
            if got is not None:
                break
            time.sleep(0.5)
        assert got is not None, log.read_text()
        status, body = got
        assert status == 200 and 'name="password"' in body
        assert "gunicorn" in log.read_text().lower()  # the production server, not runserver
        static = _get(
            f"http://127.0.0.1:{port}/static/css/app.css"
        )  # collected and served by whitenoise
        assert static is not None and static[0] == 200
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
