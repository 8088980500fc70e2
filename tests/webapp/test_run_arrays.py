"""The run reader (webapp/rollouts/arrays.py) against the test oracle: the same run read row
by row through the ORM. Runs are stored through the ingestion service; the packed blobs are
only ever read."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import make_group
from webapp.rollouts import arrays
from webapp.rollouts.ingest import ingest_groups

KEYS = {"ids", "group_ids", "steps", "lengths", "matrix"}


def orm_read(run, component_ids: list[int], step_min: int | None = None) -> dict[str, np.ndarray]:
    """The oracle: the rollout and score rows through the ORM, as arrays.read returns them."""
    from webapp.rollouts.models import RewardScore, Rollout

    rows = Rollout.objects.filter(run=run)
    if step_min is not None:
        rows = rows.filter(step__gte=step_min)
    rows = list(rows.order_by("id").values_list("id", "group_id", "step", "length"))
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    matrix = np.full((len(rows), len(component_ids)), np.nan)
    col = {cid: j for j, cid in enumerate(component_ids)}
    at = {rid: i for i, rid in enumerate(ids.tolist())}
    scores = RewardScore.objects.filter(run=run).values_list("rollout_id", "component_id", "value")
    for rid, cid, value in scores:
        if rid in at and cid in col and value is not None:
            matrix[at[rid], col[cid]] = value
    return {
        "ids": ids,
        "group_ids": np.array([r[1] for r in rows], dtype=np.int64),
        "steps": np.array([r[2] for r in rows], dtype=np.int64),
        "lengths": np.array([np.nan if r[3] is None else r[3] for r in rows], dtype=np.float64),
        "matrix": matrix,
    }


def _by_id(a: dict) -> dict:
    order = np.argsort(a["ids"], kind="stable")
    return {k: v[order] for k, v in a.items()}


def assert_same_arrays(got: dict, want: dict) -> None:
    got, want = _by_id(got), _by_id(want)
    assert set(got) == set(want) == KEYS
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert np.array_equal(got[k], want[k], equal_nan=True), k


def seed(run, steps: int = 6) -> None:
    groups = [
        make_group(
            s,
            f"p{k}",
            [
                {"correct": (i + k + s) % 2, "format": 1, "penalty": -0.1 * ((i * 7 + k) % 4)}
                for i in range(4)
            ],
        )
        for s in range(steps)
        for k in range(3)
    ]
    ingest_groups(run, {"groups": groups})


def mixed_run(run) -> list[int]:
    """Several components, a null score, unscored components, a component added to the environment
    after the first groups, and a rollout sent without a length."""
    from webapp.rollouts.services import ensure_environment

    seed(run, steps=4)
    ingest_groups(
        run,
        {"groups": [make_group(4, "partial", [{"correct": 1}, {"correct": None, "format": 0}])]},
    )
    ensure_environment("toy", [{"name": "late", "weight": 0.3}])  # existing groups never scored it
    no_length = make_group(6, "nolength", [{"correct": 0, "late": 1.0}, {"penalty": -0.5}])
    no_length["rollouts"][1]["length"] = None
    ingest_groups(
        run,
        {
            "groups": [
                make_group(
                    5, "late", [{"correct": 1, "late": 0.25}, {"late": None}, {"format": 1}]
                ),
                no_length,
            ]
        },
    )
    return [c.id for c in run.components()]


def test_it_reads_the_same_arrays_as_the_orm_reader(run):
    ids = mixed_run(run)
    assert len(ids) == 4
    got = arrays.read(run.id, ids)
    assert_same_arrays(got, orm_read(run, ids))
    got = _by_id(got)
    late = got["matrix"][:, 3]
    assert (
        np.isnan(late[got["steps"] < 5]).all() and np.nanmax(late) == 1.0
    )  # added later: NaN before
    assert np.isfinite(
        got["lengths"]
    ).all()  # a rollout sent without a length is measured at ingest
    reordered = [
        ids[3],
        ids[0],
    ]  # columns follow the requested order, whatever each group's header says
    assert_same_arrays(arrays.read(run.id, reordered), orm_read(run, reordered))


def test_it_loads_run_arrays_with_the_runs_components_and_weights(run):
    ids = mixed_run(run)
    data = arrays.load_run_arrays(run)
    want = _by_id(orm_read(run, ids))
    order = np.argsort(data.rollout_ids)
    assert np.array_equal(data.rollout_ids[order], want["ids"])
    assert np.array_equal(data.matrix[order], want["matrix"], equal_nan=True)
    assert [c.name for c in data.components] == [c.name for c in run.components()]
    assert data.weights.tolist() == [run.reward_weights()[c.name] for c in data.components]


@pytest.mark.parametrize("step_min", [4, 6, 99])
def test_it_reads_a_window_as_the_orm_reads_it(run, step_min):
    ids = mixed_run(run)
    assert_same_arrays(arrays.read(run.id, ids, step_min=step_min), orm_read(run, ids, step_min))


def test_it_reads_every_chunk_of_a_large_run(run, monkeypatch):
    ids = mixed_run(run)
    want = orm_read(run, ids)
    monkeypatch.setattr(
        arrays, "CHUNK_ROLLOUTS", 5
    )  # many chunks of a few groups (Postgres's 1 GB cap)
    assert_same_arrays(arrays.read(run.id, ids, expected=want["ids"].size), want)


@pytest.mark.parametrize("step_min", [None, 2, 99])
def test_it_counts_a_windows_rollouts_from_the_per_step_statistics(run, step_min):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ids = mixed_run(run)
    with CaptureQueriesContext(connection) as ctx:
        n = arrays.run_rollouts(run, step_min)
    assert n == orm_read(run, ids, step_min)["ids"].size
    assert not any("rollouts_group" in q["sql"] for q in ctx.captured_queries)  # no group scan


def test_it_reads_a_window_of_a_large_run_in_chunks(run, monkeypatch):
    ids = mixed_run(run)
    monkeypatch.setattr(arrays, "CHUNK_ROLLOUTS", 5)
    got = arrays.load_run_arrays(run, step_min=2)
    want = orm_read(run, ids, step_min=2)
    assert np.array_equal(np.sort(got.rollout_ids), want["ids"])


def test_it_reads_an_empty_run(run):
    got = arrays.read(run.id, [1, 2])
    assert got["ids"].size == 0 and got["matrix"].shape == (0, 2)
    assert arrays.load_run_arrays(run).n == 0


def test_it_refuses_a_blob_that_does_not_hold_its_group(run):
    from webapp.rollouts.models import Group

    ids = mixed_run(run)
    g = Group.objects.filter(run=run, key="p1", step=2).get()
    Group.objects.filter(id=g.id).update(packed_scores=bytes(g.packed_scores)[:-8])
    with pytest.raises(ValueError, match="packed_scores"):
        arrays.read(run.id, ids)


def test_it_unpacks_the_group_rows_postgres_returns():
    from webapp.rollouts.packed import records

    meta = np.zeros(2, dtype=arrays._META_DT)
    meta["id"], meta["step"], meta["size"] = [5, 6], [1, 2], [8, 8]
    got = records(meta.tobytes(), arrays._META_DT)
    assert got["id"].tolist() == [5, 6] and got["size"].tolist() == [8, 8]
    with pytest.raises(ValueError):
        records(meta.tobytes()[:-3], arrays._META_DT)


def _migrate_rollouts(target: str | None = None) -> None:
    """Migrate the rollouts app to `target` (None: every app to its latest migration)."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    if target is None:  # every app's latest: going back unapplied the apps that depend on rollouts
        executor.migrate(executor.loader.graph.leaf_nodes())
    else:
        executor.migrate([("rollouts", target)])


@pytest.mark.django_db(
    transaction=True
)  # migrations alter tables: SQLite cannot inside a transaction
def test_it_backfills_the_same_blobs_ingestion_writes(run):
    from django.db.models import Q

    from webapp.rollouts.models import Group

    ids = mixed_run(run)
    late = Group.objects.get(run=run, key="late")
    written = (bytes(late.packed_scores), late.packed_components)
    assert written[1] == ",".join(map(str, ids))
    assert Group.objects.get(run=run, key="partial").packed_components == ",".join(
        map(str, ids[:3])
    )
    _migrate_rollouts(
        "0008_search_index_by_run"
    )  # the column is nullable again: groups stored before 0006
    try:
        Group.objects.filter(Q(step__lt=3) | Q(key="late")).update(
            packed_scores=None, packed_components=""
        )
    finally:
        _migrate_rollouts()  # 0009: backfills them, then NOT NULL
    assert not Group.objects.filter(packed_scores=None).exists()
    late.refresh_from_db()
    assert (bytes(late.packed_scores), late.packed_components) == written  # byte for byte
    # The backfill heads every group with the environment's current components.
    assert set(Group.objects.filter(step__lt=3).values_list("packed_components", flat=True)) == {
        written[1]
    }
    assert_same_arrays(arrays.read(run.id, ids), orm_read(run, ids))


def test_it_refuses_a_group_without_a_blob_at_the_database(run):
    from django.db import IntegrityError, transaction

    from webapp.rollouts.models import Group

    mixed_run(run)
    with pytest.raises(IntegrityError), transaction.atomic():
        Group.objects.filter(run=run).update(packed_scores=None)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_reads_the_chunks_of_a_large_run_on_several_connections(run, monkeypatch):
    """Committed rows (another connection sees only those): the chunks are read on their own
    connections at once, and the arrays equal the ORM's."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    ids = mixed_run(run)
    want = orm_read(run, ids)
    monkeypatch.setattr(arrays, "CHUNK_ROLLOUTS", 5)
    backends = []
    real = arrays._chunk_on_own_connection

    def spy(sql):
        from django.db import connections

        connections["default"].ensure_connection()
        backends.append(connections["default"].connection.info.backend_pid)
        return real(sql)

    monkeypatch.setattr(arrays, "_chunk_on_own_connection", spy)
    assert_same_arrays(arrays.read(run.id, ids, expected=want["ids"].size), want)
    assert len(backends) > 2 and connection.connection.info.backend_pid not in backends
    assert not connection.in_atomic_block


@pytest.mark.postgres
def test_it_reads_a_large_run_on_its_own_connection_inside_a_transaction(run, monkeypatch):
    """Inside a transaction the chunks stay on the transaction's connection: another one would
    not see its rows."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("needs Postgres (DATABASE_URL=postgres://...)")
    ids = mixed_run(run)
    want = orm_read(run, ids)
    monkeypatch.setattr(arrays, "CHUNK_ROLLOUTS", 5)
    monkeypatch.setattr(arrays, "_chunk_on_own_connection", None)  # never called
    assert_same_arrays(arrays.read(run.id, ids, expected=want["ids"].size), want)
