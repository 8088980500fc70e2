"""Fixtures for the reliability suite: PRIVATE Postgres and Redis servers that a test may stop and
restart at will (never the machine's shared ones: other engineers and CI use them), row counters for
"nothing partial stored" checks, and a runserver process pointed at any database."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def row_counts() -> dict[str, int]:
    """Rows of every table ingestion writes to (plus metrics and runs): before/after deltas
    of a case."""
    from webapp.rollouts.models import (
        Group,
        GroupComponentStat,
        RewardComponent,
        RewardScore,
        Rollout,
    )
    from webapp.runs.models import Run, StepMetric

    return {
        m.__name__: m.objects.count()
        for m in (Group, Rollout, RewardScore, GroupComponentStat, StepMetric, Run, RewardComponent)
    }


# ----------------------------------------------------------------------------------------- Postgres


def _pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if not found:
        pytest.skip(f"no {name} under /usr/lib/postgresql/*/bin")
    return str(found[-1])


class PrivatePostgres:
    """A throwaway cluster in a temp dir, run as the `postgres` OS user (initdb refuses root),
    trust auth on 127.0.0.1:<free port>. `restart()` is a real stop (fast: open connections are
    cut) + start."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rd-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.log = self.dir / "server.log"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        self._as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        shutil.chown(self.dir, "postgres", "postgres") if os.geteuid() == 0 else None

    def _run(self, *args: str, timeout: float = 60) -> None:
        subprocess.run([*self._as_pg, *args], check=True, capture_output=True, timeout=timeout)

    def init(self) -> None:
        self._run(
            _pg_bin("initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            timeout=120,
        )

    def start(self) -> None:
        opts = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=50"
        )
        self._run(
            _pg_bin("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            opts,
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):  # already down, or never started
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    if not shutil.which("runuser") and os.geteuid() == 0:
        pytest.skip("runuser is needed to run initdb as the postgres user")
    pg = PrivatePostgres()
    try:
        pg.init()
        pg.start()
        yield pg
    finally:
        pg.cleanup()


# -------------------------------------------------------------------------------------------- Redis


class PrivateRedis:
    """`redis-server --port <free> --save ""` as our own child process (no persistence: a restart
    loses every queued message, the harshest case for the broker)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.skip("redis-server is not installed")
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not _port_open(self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("private redis-server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    r = PrivateRedis()
    r.start()
    try:
        yield r
    finally:
        if r.proc is not None and r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait(timeout=10)


# ---------------------------------------------------------------------------------------- processes


class Server:
    """`manage.py runserver --noreload` in its own session on `database_url`."""

    def __init__(self, database_url: str, log_path: Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.env = dict(os.environ, DATABASE_URL=database_url, PYTHONUNBUFFERED="1", **env)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "runserver",
                    f"127.0.0.1:{self.port}",
                    "--noreload",
                    "--skip-checks",
                ],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"runserver exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=2).close()
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise RuntimeError(
            f"runserver not answering after {timeout} s:\n{self.log_path.read_text()[-3000:]}"
        )

    def stop(self) -> None:
        kill_group(self.proc)


def kill_group(proc: subprocess.Popen | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def manage(database_url: str, *args: str, timeout: float = 120, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, DATABASE_URL=database_url, **env),
    )
    if out.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout
