"""Two people annotating the same rollout at the same moment both keep their row; the same person's
double submit ends as one row. Real threads, each with its own database connection."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from tests.conftest import make_group
from webapp.annotations import services
from webapp.annotations.models import Annotation, Label
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Rollout

# No serialized_rollback: restoring the serialized database collides (UNIQUE on django_content_type)
# with the content types that post_migrate re-creates after an earlier transactional test's flush.
# The flush wipes the default labels (a data migration), as every transactional test's does; code
# that needs them calls taxonomy.ensure_default_labels.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def default_labels(transactional_db):
    from webapp.annotations.taxonomy import ensure_default_labels

    ensure_default_labels()  # gone if an earlier transactional test flushed the database


def in_threads(*fns: Callable[[], None]) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported to the test below
                errors.append(e)
            finally:
                connection.close()  # each thread opened its own connection

        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


@pytest.fixture
def rollout(run) -> Rollout:
    ingest_groups(run, {"groups": [make_group(0, "p", [{"correct": 1}, {"correct": 0}])]})
    return Rollout.objects.filter(run=run).first()


def test_it_keeps_both_rows_when_two_annotators_save_at_once(rollout, personas):
    start = threading.Barrier(2)
    hack, good = Label.objects.get(slug="reward-hacking"), Label.objects.get(slug="good")

    def save(user, label):
        def fn() -> None:
            start.wait(10)
            services.save_annotation(rollout, user, label=label, note=user.username)

        return fn

    assert in_threads(save(personas["annotator"], hack), save(personas["trainer"], good)) == []
    got = dict(
        Annotation.objects.filter(rollout=rollout).values_list("author__username", "label__slug")
    )
    assert got == {"annotator": "reward-hacking", "trainer": "good"}


@pytest.mark.postgres
def test_it_keeps_both_rows_when_both_transactions_are_open_together(rollout, personas):
    """Both inserts sit in open transactions at the same time, then both commit (Postgres: SQLite
    serialises writers at BEGIN, so two open write transactions cannot exist there)."""
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    both_inserted = threading.Barrier(2)
    hack = Label.objects.get(slug="reward-hacking")

    def save(user):
        def fn() -> None:
            with transaction.atomic():
                services.save_annotation(rollout, user, label=hack, note=user.username)
                both_inserted.wait(10)  # neither has committed yet

        return fn

    assert in_threads(save(personas["annotator"]), save(personas["trainer"])) == []
    assert Annotation.objects.filter(rollout=rollout).count() == 2


@pytest.mark.postgres
def test_it_turns_the_same_persons_racing_insert_into_an_update(rollout, personas):
    """A holds an uncommitted insert; B's insert of the same (rollout, author) waits on it, fails on
    the unique constraint once A commits, and the retry updates A's row: one row, B's values."""
    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    me = personas["annotator"]
    a_inserted = threading.Event()

    def first() -> None:
        with transaction.atomic():
            services.save_annotation(
                rollout, me, label=Label.objects.get(slug="good"), note="first"
            )
            a_inserted.set()
            time.sleep(0.5)  # B is now blocked on our uncommitted unique key

    def second() -> None:
        a_inserted.wait(10)
        services.save_annotation(
            rollout, me, label=Label.objects.get(slug="format-error"), note="second"
        )

    assert in_threads(first, second) == []
    [row] = Annotation.objects.filter(rollout=rollout)
    assert (row.label.slug, row.note) == ("format-error", "second")
