"""A replay through a real Celery worker process on the configured broker (Redis when
CELERY_BROKER_URL says so, else the filesystem transport), against the test database."""

import pytest

from tests.conftest import wait_for
from tests.webapp import replay_fixtures as fx
from tests.webapp.test_replay import STRICT, STRICT_GROUP


@pytest.mark.slow
@pytest.mark.broker
def test_it_replays_in_a_real_worker(worker_process, personas, settings):
    from webapp.replays import services
    from webapp.replays.models import Replay, ReplayChunk

    run = fx.diagram_run(personas["trainer"])
    fx.ingest(run, [fx.group_record(step, f"g{step}", STRICT_GROUP) for step in range(4)])
    settings.REPLAY_CHUNK_ROLLOUTS = 12  # two chunks, so the worker claims more than one
    replay = services.create_replay(run, {"versions": STRICT})
    services.enqueue(replay)
    done = wait_for(
        lambda: Replay.objects.filter(id=replay.id, status__in=Replay.FINISHED).first(), timeout=120
    )
    assert done.status == "succeeded", done.error
    assert done.done == 24 and done.stats["n_changed"] == 8 and done.scores.count() == 24
    assert set(ReplayChunk.objects.filter(replay=done).values_list("status", flat=True)) == {"done"}
    assert "replayed 24 of 24 rollouts" in wait_for(
        lambda: "replayed 24" in worker_process.read_text() and worker_process.read_text()
    )
