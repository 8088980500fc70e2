""" "Train with this reward": a replay's button launches a GRPO twin of its run with the replayed
versions, through the one launch path (webapp.runs.launch), and the overlay compares the twin with
the original.

The queue is the only thing replaced (enqueue_run recorded instead of sent): no GPU
worker exists here.
"""

from __future__ import annotations

import os

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from tests.conftest import make_group
from tests.webapp import replay_fixtures as fx
from training import reward_versions as rv
from webapp.runs import launch
from webapp.runs.models import Run

NO_EXTRAS = [{"version": "semantic_coverage@no_extras"}]
BASE_MODEL = (
    "/models/tiny-diagram"  # a plain folder: resolve_model passes it through, nothing is built
)


@pytest.fixture
def queued(monkeypatch) -> list[int]:
    sent: list[int] = []
    monkeypatch.setattr(launch, "enqueue_run", lambda run_id: sent.append(run_id) or "gpu")
    return sent


def _replay(personas, status: str = "succeeded", kind: str = "grpo", base_model: str = BASE_MODEL):
    """A GRPO job run (its config as the launch form stores it) with a finished replay
    of two groups."""
    from webapp.replays import services
    from webapp.replays.models import Replay

    run = fx.diagram_run(personas["trainer"], status=status)
    Run.objects.filter(id=run.id).update(
        kind=kind,
        base_model=base_model,
        config={
            **run.config,
            "learning_rate": 2e-5,
            "max_steps": 50,
        },
        reward_settings={"weights": {"semantic_coverage": 3.0}},  # the run's one weight source
    )
    run.refresh_from_db()
    fx.ingest(
        run,
        [
            fx.group_record(0, "a", [fx.EDGE_SPAM, fx.MISSING_EDGE, fx.PROSE]),
            fx.group_record(1, "b", [fx.FULL, fx.EXTRA_NODE, fx.PROSE]),
        ],
    )
    replay = services.create_replay(run, {"versions": NO_EXTRAS})
    services.work(replay.id, "test")
    return Replay.objects.select_related("run").get(id=replay.id)


def _train(client, replay):
    return client.post(reverse("replays-train", args=[replay.id]))


def test_it_launches_a_queued_grpo_twin_trained_with_the_replayed_versions(
    personas, client_as, queued
):
    from workers.jobs import job_config

    replay = _replay(personas)
    run = replay.run
    r = _train(client_as("trainer"), replay)
    twin = Run.objects.exclude(id=run.id).get()
    assert r.status_code == 302 and r["Location"] == reverse(
        "diagnostics-overlay", args=[run.id, twin.id]
    )
    assert (twin.kind, twin.status, twin.parent_id, twin.base_model) == (
        "grpo",
        "queued",
        run.id,
        BASE_MODEL,
    )
    assert queued == [twin.id] and twin.config["start_after_parent"] is False
    version = rv.lookup("diagram", "semantic_coverage@no_extras")
    expected = {
        "semantic_coverage": {
            "environment": "diagram",
            "target": version.target,
            "params": version.params,
            "source_hash": version.source_hash,
            "name": "semantic_coverage@no_extras",
        }
    }
    assert twin.config["reward_versions"] == expected
    assert (twin.config["replay_of"], twin.config["replay_id"]) == (run.id, replay.id)
    assert (
        twin.config["learning_rate"] == 2e-5 and twin.config["max_steps"] == 50
    )  # the run's start point
    assert (
        twin.reward_weights()["semantic_coverage"] == 3.0
    )  # the run's own weights, not the env's, in its reward settings alone
    assert "reward_weights" not in twin.config
    assert twin.provenance["reward_versions"] == expected and twin.provenance["replay"] == replay.id
    assert twin.provenance["components"]["semantic_coverage"] == version.source_hash
    replay.refresh_from_db()
    assert replay.twin_id == twin.id
    cfg = job_config(twin)  # what the GPU worker hands grpo.main
    assert cfg.reward_versions == expected and cfg.learning_rate == 2e-5
    assert (
        cfg.reward_weights[[c.name for c in run_components_of(run)].index("semantic_coverage")]
        == 3.0
    )


def run_components_of(run):
    return list(run.environment.components.order_by("position", "id"))


def test_it_launches_one_twin_per_replay(personas, client_as, queued):
    replay = _replay(personas)
    first, again = _train(client_as("trainer"), replay), _train(client_as("trainer"), replay)
    assert first["Location"] == again["Location"] and Run.objects.count() == 2 and len(queued) == 1
    page = client_as("viewer").get(reverse("replays-detail", args=[replay.id])).content.decode()
    assert 'id="replay-twin"' in page and 'id="replay-train"' not in page


def test_it_queues_the_twin_behind_a_run_still_training(personas, client_as, queued):
    replay = _replay(personas, status="running")
    r = _train(client_as("trainer"), replay)
    twin = Run.objects.exclude(id=replay.run_id).get()
    assert r.status_code == 302 and twin.config["start_after_parent"] is True and queued == []
    assert (
        "starts when the original run finishes" in [str(m) for m in get_messages(r.wsgi_request)][0]
    )


@pytest.mark.parametrize("role", ["viewer", "annotator"])
def test_it_lets_only_trainers_train_with_a_replay(personas, client_as, queued, role):
    replay = _replay(personas)
    assert _train(client_as(role), replay).status_code == 403
    page = client_as(role).get(reverse("replays-detail", args=[replay.id])).content.decode()
    assert (
        reverse("replays-train", args=[replay.id]) not in page
        and "Train with this reward" not in page
    )
    assert Run.objects.count() == 1 and queued == []
    trainer_page = (
        client_as("trainer").get(reverse("replays-detail", args=[replay.id])).content.decode()
    )
    assert reverse("replays-train", args=[replay.id]) in trainer_page


@pytest.mark.parametrize("kind, base_model", [("import", BASE_MODEL), ("grpo", "")])
def test_it_offers_no_training_for_a_run_without_a_start_point(
    personas, client_as, queued, kind, base_model
):
    replay = _replay(personas, kind=kind, base_model=base_model)
    page = client_as("trainer").get(reverse("replays-detail", args=[replay.id])).content.decode()
    assert reverse("replays-train", args=[replay.id]) not in page  # no button: the reason instead
    assert 'id="replay-no-train"' in page and "start point" in page
    r = _train(client_as("trainer"), replay)
    assert r.status_code == 302 and r["Location"] == reverse("replays-detail", args=[replay.id])
    assert "start point" in [str(m) for m in get_messages(r.wsgi_request)][0]
    assert Run.objects.count() == 1 and queued == []


def test_it_refuses_a_version_whose_code_changed_since_the_replay(personas, client_as, queued):
    from webapp.replays.models import Replay

    replay = _replay(personas)
    Replay.objects.filter(id=replay.id).update(
        versions=[{**replay.versions[0], "source_hash": "0" * 16}]
    )
    r = _train(client_as("trainer"), replay)
    assert r.status_code == 302 and r["Location"] == reverse("replays-detail", args=[replay.id])
    assert (
        "changed since the version was recorded"
        in [str(m) for m in get_messages(r.wsgi_request)][0]
    )
    assert Run.objects.count() == 1 and queued == []


def test_it_overlays_the_replay_twin_with_the_original(personas, client_as, queued):
    from webapp.rollouts.ingest import ingest_groups

    replay = _replay(personas)
    _train(client_as("trainer"), replay)
    twin = Run.objects.exclude(id=replay.run_id).get()
    ingest_groups(
        twin,
        {
            "groups": [
                make_group(s, "p", [{"semantic_coverage": 0.2 * s}, {"semantic_coverage": 0}])
                for s in range(3)
            ]
        },
    )
    page = client_as("viewer").get(reverse("diagnostics-overlay", args=[replay.run_id, twin.id]))
    html = page.content.decode()
    assert (
        page.status_code == 200
        and f"twin: {twin.name}" in html
        and f"original: {replay.run.name}" in html
    )
    assert reverse("replays-detail", args=[replay.id]) in html
    assert "training.environments.diagram.rewards:semantic_coverage" in html


MARKER_MODULE = """
from training import reward_versions


def marker(prompt, completion, *, value=0.5):
    return (value, "scored by the replayed marker version")


reward_versions.register(
    "diagram", "semantic_coverage", "replay_e2e_marker:marker", {"value": 0.625},
    name="semantic_coverage@marker",
)
"""


@pytest.fixture
def marker_module(tmp_path, monkeypatch):
    """A team's own reward module, deployed with the web and worker processes (on their
    PYTHONPATH, named in RD_REWARD_MODULES) and imported here as the web process does at start-up.
    Requested before worker_process so the worker (and its job child, which trains only registered
    versions) inherit both."""
    import importlib
    import sys

    folder = tmp_path / "team_rewards"
    folder.mkdir()
    (folder / "replay_e2e_marker.py").write_text(MARKER_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("RD_REWARD_MODULES", "replay_e2e_marker")
    importlib.import_module("replay_e2e_marker")
    yield rv.lookup("diagram", "semantic_coverage@marker")
    rv._REGISTRY.pop(("diagram", "semantic_coverage@marker"), None)
    sys.modules.pop("replay_e2e_marker", None)


@pytest.mark.slow
@pytest.mark.broker
def test_it_trains_the_twin_on_the_replayed_version_in_a_real_worker(
    marker_module, worker_process, client_as
):
    """Outside in: a stored run, a replay with the team's version, the button, then a real Celery
    worker runs the twin's GRPO job (tiny model, one step) in its child process: every rollout the
    twin stores carries the replayed version's value and reason for semantic_coverage, and the
    environment's own for the rest."""
    from tests.conftest import wait_for
    from webapp.replays import services
    from webapp.rollouts.models import RewardScore

    run = fx.diagram_run(None)
    Run.objects.filter(id=run.id).update(
        base_model="tiny:diagram",
        config={
            "max_steps": 1,
            "num_prompts": 4,
            "num_generations": 2,  # one step of two tiny groups: CPU time
            "per_device_batch_size": 4,
            "max_completion_length": 16,
            "logging_steps": 1,
        },
    )
    run.refresh_from_db()
    fx.ingest(run, [fx.group_record(0, "a", [fx.EDGE_SPAM, fx.MISSING_EDGE, fx.PROSE])])
    replay = services.create_replay(run, {"versions": [{"version": "semantic_coverage@marker"}]})
    services.work(replay.id, "test")
    replay.refresh_from_db()
    assert replay.status == "succeeded", replay.error

    assert client_as("trainer").post(reverse("replays-train", args=[replay.id])).status_code == 302
    twin = Run.objects.get(config__replay_id=replay.id)
    twin = wait_for(
        lambda: (twin.refresh_from_db() or twin.status in ("succeeded", "failed")) and twin,
        timeout=400,
        interval=1,
    )
    assert twin.status == "succeeded", f"{twin.error}\n{twin.log_tail}"
    scores = list(RewardScore.objects.filter(run=twin).select_related("component"))
    coverage = [s for s in scores if s.component.name == "semantic_coverage"]
    assert len(coverage) == 4 and {(s.value, s.reason) for s in coverage} == {
        (0.625, "scored by the replayed marker version")
    }
    assert all(
        s.reason != "scored by the replayed marker version" for s in scores if s not in coverage
    )


def test_it_trains_with_a_replay_through_the_api(personas, api, queued):
    replay = _replay(personas)
    url = reverse("api-replay-train", args=[replay.id])
    refused = api(personas["annotator"]).post(url)
    assert refused.status_code == 403 and Run.objects.count() == 1
    trainer = api(personas["trainer"])
    first = trainer.post(url)
    twin = Run.objects.exclude(id=replay.run_id).get()
    assert first.status_code == 201 and first.json()["twin"] == twin.id and queued == [twin.id]
    assert (
        first.json()["reward_versions"]["semantic_coverage"]["name"]
        == "semantic_coverage@no_extras"
    )
    assert first.json()["overlay"] == reverse("diagnostics-overlay", args=[replay.run_id, twin.id])
    again = trainer.post(url)
    assert again.status_code == 200 and again.json()["twin"] == twin.id and Run.objects.count() == 2
