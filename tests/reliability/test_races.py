"""Races on real Postgres: identical ingests, identical imports and find-or-create of one run name,
at the same moment, from separate connections (threads, each with its own connection; one case with
two processes). Nothing may fail with a 500 or an exception, and nothing may be stored twice.

Run with DATABASE_URL=postgres://... (skipped on SQLite, where BEGIN IMMEDIATE serialises writers).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from tests.conftest import database_url_for_children, make_group
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Group, GroupComponentStat, RewardScore, Rollout, StepStat
from webapp.rollouts.services import ensure_environment, get_or_create_run
from webapp.runs.models import Run

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
TRIALS = (
    12  # each trial is one fresh race; a lost race showed up in about half of them before the fix
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _postgres_only(transactional_db):
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")


def at_once(*fns: Callable[[], object]) -> tuple[list[object], list[BaseException]]:
    """Run each function in its own thread (own connection), released together by a barrier."""
    start = threading.Barrier(len(fns))
    results: list[object] = [None] * len(fns)
    errors: list[BaseException] = []

    def wrap(i: int, fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                start.wait(10)
                results[i] = fn()
            except BaseException as e:  # noqa: BLE001 - reported to the test
                errors.append(e)
            finally:
                connection.close()

        return run

    threads = [threading.Thread(target=wrap(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results, errors


def batch(prefix: str, n: int = 8) -> dict:
    values = [
        {"correct": 1, "format": 0.5},
        {"correct": 0, "format": 1},
        {"correct": 1, "penalty": -0.2},
    ]
    return {
        "groups": [make_group(step, f"{prefix}-{i}", values) for step in (0, 1) for i in range(n)]
    }


def assert_stored_once(run: Run, groups: int, per_group: int = 3) -> None:
    assert Group.objects.filter(run=run).count() == groups
    assert Rollout.objects.filter(run=run).count() == groups * per_group
    assert Group.objects.filter(run=run).values("step", "key").distinct().count() == groups
    # batch(): 6 scores (2 per rollout) and 3 component stats (correct, format, penalty) per group
    assert RewardScore.objects.filter(run=run).count() == groups * 6
    assert GroupComponentStat.objects.filter(run=run).count() == groups * 3
    n_rollouts = sum(
        StepStat.objects.filter(run=run, component_id=0).values_list("n_rollouts", flat=True)
    )
    assert n_rollouts == groups * per_group  # the step sums counted each batch once


def test_it_stores_two_identical_api_batches_sent_at_once_once(run, api, personas):
    client_a, client_b = api(personas["trainer"]), api(personas["trainer"])
    for trial in range(TRIALS):
        body = batch(f"t{trial}")
        url = f"/api/v1/runs/{run.id}/groups/"
        (a, b), errors = at_once(
            partial(client_a.post, url, body, format="json"),
            partial(client_b.post, url, body, format="json"),
        )
        assert errors == []
        assert sorted([a.status_code, b.status_code]) == [200, 201], (a.content, b.content)
        assert sorted([a.json()["skipped_groups"], b.json()["skipped_groups"]]) == [0, 16]
    assert_stored_once(run, TRIALS * 16)


def test_it_retries_a_batch_that_waited_on_an_uncommitted_identical_one(run):
    """Deterministic form of the race: A's COPY holds the new groups' unique keys uncommitted, B's
    COPY of the same groups waits on them, then meets psycopg's UniqueViolation when A commits."""
    body = batch("held")
    a_written = threading.Event()

    def first() -> object:
        with transaction.atomic():
            out = ingest_groups(run, body)
            a_written.set()
            time.sleep(0.5)  # B is now past its "already stored?" check and blocked in COPY
        return out

    def second() -> object:
        a_written.wait(10)
        return ingest_groups(run, body)

    (a, b), errors = at_once(first, second)
    assert errors == []
    assert (a.groups, b.groups, b.skipped_groups) == (16, 0, 16)
    assert_stored_once(run, 16)


def test_it_gives_every_caller_naming_a_new_run_the_same_run(env3):
    for trial in range(TRIALS):
        name = f"named-{trial}"
        results, errors = at_once(
            *[partial(get_or_create_run, name=name, kind="import", environment=env3)] * 3
        )
        assert errors == []
        assert len({run.id for run, _ in results}) == 1
        assert sorted(created for _, created in results) == [False, False, True]
        assert Run.objects.filter(name=name).count() == 1


def test_it_answers_racing_api_get_or_create_requests_with_one_run(api, personas):
    client_a, client_b = api(personas["trainer"]), api(personas["trainer"])
    for trial in range(TRIALS):
        body = {
            "name": f"api-{trial}",
            "get_or_create": True,
            "environment": {"name": f"api-env-{trial}", "components": [{"name": "correct"}]},
        }
        (a, b), errors = at_once(
            partial(client_a.post, "/api/v1/runs/", body, format="json"),
            partial(client_b.post, "/api/v1/runs/", body, format="json"),
        )
        assert errors == []
        assert sorted([a.status_code, b.status_code]) == [200, 201], (a.content, b.content)
        assert a.json()["id"] == b.json()["id"]
        assert Run.objects.filter(name=f"api-{trial}").count() == 1


def write_dump(path: Path, prefix: str, n: int = 30) -> Path:
    rows = [
        make_group(i % 3, f"{prefix}-{i}", [{"correct": 1}, {"correct": 0, "format": 1}])
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def import_file(path: Path, run_name: str) -> str:
    out = io.StringIO()
    call_command(
        "import_rollouts",
        str(path),
        "--run",
        run_name,
        "--format",
        "jsonl",
        "--no-progress",
        "--batch-groups",
        "7",
        stdout=out,
        stderr=io.StringIO(),
    )
    return out.getvalue()


def test_it_imports_one_file_twice_at_once_into_one_new_run_once(tmp_path):
    for trial in range(TRIALS):
        dump = write_dump(tmp_path / f"{trial}.jsonl", f"imp{trial}")
        name = f"import-{trial}"
        outs, errors = at_once(partial(import_file, dump, name), partial(import_file, dump, name))
        assert errors == []
        [run] = Run.objects.filter(name=name)
        assert run.status == "succeeded"
        assert Group.objects.filter(run=run).count() == 30
        assert Rollout.objects.filter(run=run).count() == 60
        assert sum("created run" in out for out in outs) == 1


def test_it_imports_into_one_existing_run_from_two_imports_at_once(run, tmp_path):
    for trial in range(TRIALS):
        dump = write_dump(tmp_path / f"{trial}.jsonl", f"into{trial}")
        _, errors = at_once(
            partial(import_file, dump, run.name), partial(import_file, dump, run.name)
        )
        assert errors == []
    assert Group.objects.filter(run=run).count() == TRIALS * 30
    assert Group.objects.filter(run=run).values("step", "key").distinct().count() == TRIALS * 30


@pytest.mark.slow
def test_it_imports_one_file_from_two_processes_into_one_new_run(tmp_path):
    """Two `manage.py import_rollouts` processes, as two shells or two workers would run them."""
    env = dict(os.environ, DATABASE_URL=database_url_for_children())
    for trial in range(3):
        dump = write_dump(tmp_path / f"{trial}.jsonl", f"proc{trial}", n=60)
        cmd = [
            sys.executable,
            "manage.py",
            "import_rollouts",
            str(dump),
            "--run",
            f"proc-{trial}",
            "--format",
            "jsonl",
            "--no-progress",
            "--batch-groups",
            "5",
        ]
        procs = [
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=180) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        [run] = Run.objects.filter(name=f"proc-{trial}")
        assert Group.objects.filter(run=run).count() == 60


def test_it_adds_the_same_new_components_from_two_callers_at_once():
    comps = [
        {
            "name": n,
            "weight": 1.0,
            "kind": "outcome",
            "min_value": None,
            "max_value": None,
            "description": "",
            "source_hash": "",
        }
        for n in ("a", "b", "c")
    ]
    for trial in range(TRIALS):
        _, errors = at_once(
            partial(ensure_environment, f"env-{trial}", comps),
            partial(ensure_environment, f"env-{trial}", comps),
        )
        assert errors == []
