"""Deleting a run: marked and hidden at once, refused by ingestion, reaped in batches through every
dependent table the model graph has (webapp/runs/deletion.py). The real job racing the delete is in
tests/workers/test_run_deletion.py."""

from __future__ import annotations

import pytest

from tests.conftest import make_group
from webapp.errors import FieldError
from webapp.rollouts.ingest import ingest_groups
from webapp.runs import deletion
from webapp.runs.models import Run, StepMetric


def fill(run, groups: int = 12) -> None:
    vals = [{"correct": 1.0, "format": 0.5}, {"correct": 0.0, "format": 1.0}]
    for step in range(groups // 4):
        ingest_groups(run, {"groups": [make_group(step, f"k{k}", vals) for k in range(4)]})


def annotate(run, user) -> None:
    from webapp.annotations.models import Annotation, Label
    from webapp.rollouts.models import Rollout

    label = Label.objects.first() or Label.objects.create(name="hack")
    Annotation.objects.create(
        rollout=Rollout.objects.filter(run=run).first(), author=user, label=label
    )


def test_it_reaps_every_dependent_row_in_batches(
    db, run, personas, monkeypatch, settings, tmp_path
):
    from webapp.annotations.models import Annotation

    settings.RUNS_DIR = tmp_path
    (tmp_path / str(run.id)).mkdir()
    other = Run.objects.create(name="other", environment=run.environment, status="running")
    fill(run)
    fill(other, 4)
    annotate(run, personas["annotator"])
    StepMetric.objects.create(run=run, step=0, name="loss", value=1.0)
    Run.objects.filter(id=run.id).update(status="succeeded")
    monkeypatch.setattr(deletion, "FIRST_BATCH", 2)
    monkeypatch.setattr(deletion, "BATCH_SECONDS", 1e6)  # no growth: a batch stays 2 rows

    assert deletion.request_delete(run) is True
    assert deletion.request_delete(run) is False  # already marked
    report = deletion.reap(run.id)

    assert report.finished and report.rows["rollouts.Group"] == 12
    assert report.batches >= 6
    assert not Run.objects.filter(id=run.id).exists()
    for model, fk in deletion.dependents():
        assert not model._base_manager.filter(**{fk: run.id}).exists(), model
    assert not Annotation.objects.exists()
    assert not (tmp_path / str(run.id)).exists()
    assert other.groups.count() == 4  # another run's rows are untouched


def test_it_refuses_a_batch_for_a_run_marked_deleted_naming_it(db, run):
    fill(run, 4)
    deletion.request_delete(run)
    with pytest.raises(FieldError) as e:
        ingest_groups(run, {"groups": [make_group(9, "late", [{"correct": 1.0}])]})
    assert e.value.errors == [{"field": "run", "error": f"run {run.id} was deleted"}]
    assert run.groups.count() == 4


def test_it_hides_a_run_marked_deleted_from_pages_and_the_api(db, run, client_as, api, personas):
    deletion.request_delete(run)
    assert client_as("viewer").get(f"/runs/{run.id}/").status_code == 404
    assert client_as("viewer").get(f"/runs/{run.id}/rollouts/").status_code == 404
    listed = api(personas["trainer"]).get("/api/v1/runs/").json()["runs"]
    assert run.id not in [r["id"] for r in listed]
    res = api(personas["trainer"]).post(
        f"/api/v1/runs/{run.id}/groups/",
        {"groups": [make_group(0, "k", [{"correct": 1.0}])]},
        format="json",
    )
    assert res.status_code == 404


def test_it_keeps_the_run_row_until_its_job_has_stopped(db, env3):
    from webapp.rollouts.services import create_run

    job = create_run(name="job", kind="grpo", environment=env3, config={}, status="running")
    chained = create_run(name="next", kind="eval", environment=env3, config={}, parent=job)
    fill(job, 4)
    deletion.request_delete(job)
    chained.refresh_from_db()
    assert chained.status == "failed" and f"its parent run {job.id} (job) was deleted" in (
        chained.error
    )
    report = deletion.reap(job.id)
    assert report.waiting_for_job and not report.finished
    assert job.groups.count() == 0 and Run.objects.filter(id=job.id).exists()
    job.mark_cancelled()  # what the worker does once the job process is gone
    assert deletion.reap(job.id).finished


def test_it_finds_dependents_from_the_model_graph_hidden_relations_included():
    from webapp.rollouts.models import Group, Rollout, SearchWord

    found = {m for m, _ in deletion.dependents()}
    top = {m for m, _ in deletion.top_dependents()}
    assert {Group, Rollout, SearchWord} <= found  # SearchWord's relation is hidden (related_name +)
    assert Group in top and Rollout not in top  # a rollout goes with its group's cascade


def test_it_sizes_batches_by_time():
    assert deletion._next_size(100, 0.01) == 200
    assert deletion._next_size(100, 10.0) == 50
    assert deletion._next_size(100, deletion.BATCH_SECONDS) == 100


@pytest.mark.skipif(
    not __import__("os").environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="reads Postgres's index catalogue",
)
def test_every_cascade_the_reaper_follows_has_an_index_on_its_column(db):
    """Each batch deletes the rows below it by foreign key (Django's Collector): a column with no
    index leading with it is a scan of the whole table per batch. Holds for any app added later
    (per-rollout tokens, behaviours) as soon as it points at a run, a group or a rollout."""
    from django.db import connection, models
    from django.db.models.deletion import get_candidate_relations_to_delete

    def leading_columns(table: str) -> set[str]:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid "
                "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = i.indkey[0] "
                "WHERE t.relname = %s",
                [table],
            )
            return {r[0] for r in cur.fetchall()}

    missing, seen = [], set()
    todo = [Run]
    while todo:
        model = todo.pop()
        for rel in get_candidate_relations_to_delete(model._meta):
            child = rel.related_model
            if rel.on_delete is not models.CASCADE:
                continue
            if rel.field.column not in leading_columns(child._meta.db_table):
                missing.append(f"{child._meta.db_table}.{rel.field.column}")
            if child not in seen:
                seen.add(child)
                todo.append(child)
    assert missing == []


def test_it_deletes_from_the_admin_list_action_by_marking(db, run, client_as):
    """The admin's bulk "delete selected" marks each run; its confirmation page lists the runs, not
    their rollouts (collecting a million of them would time the page out)."""
    fill(run, 4)
    admin = client_as("admin")
    data = {"action": "delete_selected", "_selected_action": [run.id]}
    page = admin.post("/admin/runs/run/", data)
    assert page.status_code == 200 and "removed in the background" in page.content.decode()
    assert f"(run {run.id} step" not in page.content.decode()  # no rollout listed
    res = admin.post("/admin/runs/run/", dict(data, post="yes"))
    assert res.status_code == 302
    run.refresh_from_db()
    assert run.deleted_at is not None and run.cancel_requested
