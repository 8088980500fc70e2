"""One table of run kinds (training.jobs.RUN_KINDS), and launch_run as the only way a job run is
created: a toy kind registered in the table alone is launchable, queued, run by workers.job and
titled on its pages; ablation twins and dataset training wait behind a parent still training."""

from __future__ import annotations

import pytest

from training import jobs
from webapp.runs.models import Run


@pytest.fixture
def sent(monkeypatch):
    from webapp.runs import launch

    queued: list[int] = []
    monkeypatch.setattr(launch, "enqueue_run", lambda run_id: queued.append(run_id) or "gpu")
    return queued


@pytest.fixture
def toy_kind(monkeypatch):
    toy = jobs.JobKind("toy", "Toy counter", "tests.workers.toy_job", "ToyJobConfig")
    monkeypatch.setitem(jobs.RUN_KINDS, "toy", toy)
    monkeypatch.setitem(jobs.JOBS, "toy", toy)
    return toy


def test_it_derives_the_run_kinds_and_their_titles_from_the_table():
    assert [value for value, _ in Run.Kind.choices] == list(jobs.RUN_KINDS)
    assert dict(Run.Kind.choices)["teacher"] == jobs.RUN_KINDS["teacher"].title
    assert Run.Kind.GRPO == "grpo" and Run.Kind.IMPORT == "import"
    assert "import" not in jobs.JOBS  # fed from elsewhere: never launched


def test_a_kind_registered_in_the_table_alone_is_launched_and_run(
    db, toy_kind, sent, tmp_path, settings, make_user
):
    from webapp.runs.launch import launch_run
    from workers import job

    settings.RUNS_DIR = tmp_path
    run = launch_run(name="count", kind="toy", environment=None, config={"n": 2})
    assert sent == [run.id]
    Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING)
    assert job.main(run.id) == 0
    run.refresh_from_db()
    assert "toy counted 2" in run.log_tail and run.summary["counted"] == 2
    assert run.config["resolved"]["n"] == 2
    make_user("boss", "admin")
    from django.test import Client

    client = Client()
    client.force_login(make_user("viewer1", "viewer"))
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "Toy counter" in page


def _running_grpo(env3, name="parent"):
    from webapp.rollouts.services import create_run

    run = create_run(name=name, kind="grpo", environment=env3, config={}, base_model="/m")
    Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING)
    run.refresh_from_db()
    return run


def test_an_ablation_twin_waits_behind_a_run_still_training(db, env3, sent, make_user):
    from webapp.diagnostics.models import Ablation
    from webapp.diagnostics.services import launch_twin

    parent = _running_grpo(env3)
    ablation = Ablation.objects.create(
        run=parent,
        name="drop format",
        spec={"drop": ["format"], "weights": {}, "scale_rewards": "group", "aggregation": "sum"},
    )
    out = launch_twin(ablation, make_user("t", "trainer"))
    assert out.twin.config["start_after_parent"] is True and sent == []
    assert out.twin.reward_weights()["format"] == 0.0
    assert "starts when the original run finishes" in out.message
    Run.objects.filter(id=parent.id).update(status=Run.Status.SUCCEEDED)
    parent.refresh_from_db()
    from workers.tasks import _after

    _after(parent)
    assert sent == [out.twin.id]


def test_a_run_needing_a_failed_parents_model_fails_at_once_and_an_import_parent_never_blocks(
    db, env3, sent
):
    from webapp.rollouts.services import create_run
    from webapp.runs.launch import launch_run

    failed = _running_grpo(env3, "failed")
    failed.mark_failed("oom")
    child = launch_run(
        name="eval",
        kind="eval",
        environment=env3,
        config={},
        base_model=f"run:{failed.id}",
        parent=failed,
    )
    child.refresh_from_db()
    assert child.status == "failed" and child.error == f"not started: parent run {failed.id} failed"
    imported = create_run(name="api", kind="import", environment=env3, config={})
    Run.objects.filter(id=imported.id).update(status=Run.Status.RUNNING)
    imported.refresh_from_db()
    twin = launch_run(
        name="from import",
        kind="grpo",
        environment=env3,
        config={},
        base_model="/m",
        parent=imported,
    )
    assert twin.config["start_after_parent"] is False and sent == [twin.id]
