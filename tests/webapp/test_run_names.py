"""get_or_create_run on whichever database the tests use (SQLite by default: BEGIN IMMEDIATE
serialises the callers; Postgres: the advisory lock). tests/reliability/test_races.py races it
harder on Postgres."""

from __future__ import annotations

from functools import partial

import pytest

from tests.reliability.test_races import at_once
from webapp.rollouts.services import RunNameConflict, create_run, get_or_create_run
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_converges_three_callers_naming_one_new_run_on_one_run(env3):
    for trial in range(8):
        name = f"sqlite-{trial}"
        results, errors = at_once(
            *[partial(get_or_create_run, name=name, kind="import", environment=env3)] * 3
        )
        assert errors == []
        assert (
            len({run.id for run, _ in results}) == 1 and Run.objects.filter(name=name).count() == 1
        )


def test_it_returns_an_existing_run_of_any_kind_as_it_is(env3):
    job = create_run(name="a job", kind="grpo", environment=env3, config={})
    run, created = get_or_create_run(name="a job", kind="import", environment=None)
    assert (run.id, run.kind, created) == (job.id, "grpo", False)


def test_it_refuses_a_name_that_several_runs_share(env3):
    for _ in range(2):
        create_run(name="same", kind="sft", environment=env3, config={})
    with pytest.raises(RunNameConflict) as e:
        get_or_create_run(name="same", kind="import", environment=env3)
    assert e.value.field == "name"


def test_it_creates_the_run_as_described(env3, personas):
    run, created = get_or_create_run(
        name="new",
        kind="import",
        environment=env3,
        config={"a": 1},
        owner=personas["trainer"],
        base_model="m",
    )
    assert created and (run.kind, run.status, run.owner, run.base_model) == (
        "import",
        "running",
        personas["trainer"],
        "m",
    )
    assert run.config["a"] == 1
