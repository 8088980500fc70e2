"""The web app serves a new environment without knowing it: tests/training/toy_env's demo data is
ingested and one of its reward variants replayed over the stored rollouts."""

from __future__ import annotations

import pytest

from tests.training.toy_env import registered
from training import demo


@pytest.fixture
def toy():
    with registered() as env:
        yield env


def test_it_replays_a_variant_of_a_registered_toy_environment(personas, toy):
    from webapp.replays import services
    from webapp.replays.models import Replay, ReplayScore
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.services import create_run, environment_from_training

    records = demo.generate_groups(toy, toy.scripted_policy(seed=3, skill=0.4), 2, 2, G=4, seed=1)
    run = create_run(
        name="toy",
        kind="grpo",
        environment=environment_from_training(toy),
        config={},
        status="succeeded",
    )
    ingest_groups(run, {"groups": records})
    replay = services.create_replay(run, {"versions": [{"version": "shouted@any_case"}]})
    services.work(replay.id, "test")
    replay = Replay.objects.get(id=replay.id)
    assert replay.status == "succeeded" and replay.failed == 0 and replay.total == 16
    scores = ReplayScore.objects.filter(replay=replay).select_related("rollout")
    for s in scores:  # any case counts now; a babbled answer still does not
        text = s.rollout.completion.strip()
        assert s.value == float(len(text.split()) == 1), (text, s.reason)
