"""Shared fixtures: the four role personas plus an outsider, a run with a 3-component environment,
and an API client factory. Integration fixtures (live server, worker) live beside their tests."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Before torch loads: idle OpenMP threads sleep instead of spinning (Postgres and the worker share
# the two cores; see workers.tasks.child_env for the measurement).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# CI runs the property-based tests on a fixed seed: a submission must not pass or fail by luck.
# Locally they explore new examples on every run (and save failures to .hypothesis/ to replay).
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    _hypothesis_settings.load_profile("ci")

PASSWORD = "correct-horse-battery"


@pytest.fixture
def make_user(db):
    from django.contrib.auth import get_user_model

    from webapp.accounts.roles import set_role

    def make(username: str, role: str | None = "viewer"):
        user = get_user_model().objects.create_user(username=username, password=PASSWORD)
        if role == "admin":
            user.is_staff = user.is_superuser = True
            user.save()
        if role:
            set_role(user, role)
        return user

    return make


@pytest.fixture
def personas(make_user) -> dict:
    return {role: make_user(role, role) for role in ("viewer", "annotator", "trainer", "admin")}


@pytest.fixture
def client_as(client, personas):
    def login(role: str | None):
        client.logout()
        if role is not None:
            client.force_login(personas[role])
        return client

    return login


@pytest.fixture
def env3(db):
    from webapp.rollouts.services import ensure_environment

    return ensure_environment(
        "toy",
        [
            {
                "name": "correct",
                "weight": 1.0,
                "kind": "outcome",
                "min_value": 0.0,
                "max_value": 1.0,
            },
            {
                "name": "format",
                "weight": 0.5,
                "kind": "behavioural",
                "min_value": 0.0,
                "max_value": 1.0,
            },
            {
                "name": "penalty",
                "weight": 0.2,
                "kind": "penalty",
                "min_value": -1.0,
                "max_value": 0.0,
            },
        ],
    )


@pytest.fixture
def run(env3, personas):
    from webapp.rollouts.services import create_run

    return create_run(
        name="toy-run",
        kind="import",
        environment=env3,
        config={},
        owner=personas["trainer"],
        status="running",
    )


def make_group(step: int, key: str, values: list[dict], prompt: str = "Solve it") -> dict:
    """A group record with one rollout per entry of `values` (component -> value)."""
    return {
        "step": step,
        "key": key,
        "prompt": prompt,
        "rollouts": [
            {"index": i, "completion": f"answer {key} {i}", "rewards": v, "length": 10 + i}
            for i, v in enumerate(values)
        ],
    }


@pytest.fixture
def api(db):
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    def for_user(user):
        c = APIClient()
        token, _ = Token.objects.get_or_create(user=user)
        c.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        return c

    return for_user


@pytest.fixture(scope="session", autouse=True)
def _private_cache():
    """Tests in this process get a cache of their own: settings point at the shared Redis or file
    cache, which outlives the test database (a cached diagnosis of run 1 would answer for the next
    session's run 1) and which cache.clear() would wipe for everyone. Server processes a test starts
    keep the configured shared cache (test_login_limit_shared checks it holds across processes)."""
    from django.test.utils import override_settings

    private = override_settings(
        CACHES={
            "default": {
                "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                "LOCATION": "tests",
            }
        }
    )
    private.enable()
    yield
    private.disable()


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # PBKDF2 costs ~0.5 s per user on two cores; tests create many users and check no hash strength.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def database_url_for_children() -> str:
    """The URL of the database the tests are using right now (pytest-django's test database), so a
    child process (a Celery worker, a training job, a server) writes where the test reads."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def worker_process(transactional_db, tmp_path):
    """A real Celery worker process on the configured broker (Redis when CELERY_BROKER_URL says so,
    else the filesystem transport), pointed at the test database. Yields the log path."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, DATABASE_URL=database_url_for_children(), PYTHONUNBUFFERED="1")
    log = tmp_path / "worker.log"
    subprocess.run(
        [sys.executable, "-m", "celery", "-A", "workers", "purge", "-f", "-Q", "default,gpu"],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=60,
    )
    hostname = f"test-{os.getpid()}@%h"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
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
                "--concurrency",
                "1",
                "-n",
                hostname,
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=root,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            if "ready." in log.read_text(errors="replace"):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{log.read_text()}")
            time.sleep(0.3)
        else:
            raise RuntimeError(f"worker not ready after 90 s:\n{log.read_text()}")
        yield log
    finally:
        import signal

        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.25):
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


@pytest.fixture(autouse=True)
def _default_labels(request):
    # The label taxonomy comes from a data migration, and a transactional test's flush wipes it for
    # every test after it; re-install it (idempotent) for any test that touches the database.
    names = set(request.fixturenames)
    if request.node.get_closest_marker("django_db") is not None:
        request.getfixturevalue("_django_db_helper")  # pytest-django's own db setup for the mark
    elif {"db", "transactional_db", "live_server"} & names:
        request.getfixturevalue(
            "transactional_db" if names & {"transactional_db", "live_server"} else "db"
        )
    else:
        return
    from webapp.annotations.taxonomy import ensure_default_labels

    ensure_default_labels()
