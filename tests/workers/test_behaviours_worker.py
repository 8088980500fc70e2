"""A behaviour is brought up to date on a run's new steps by a real Celery worker after ingestion,
with no page read: the live dashboard then reads stored steps."""

import pytest

from tests.conftest import wait_for


@pytest.mark.slow
@pytest.mark.broker
def test_it_updates_a_behaviour_after_ingest_in_a_real_worker(worker_process, run):
    from webapp.behaviours import services
    from webapp.behaviours.models import BehaviourStep
    from webapp.rollouts.ingest import ingest_groups

    b = services.define(run.environment, name="skips tests", query={"q": "skipped"})

    def group(step: int) -> dict:
        texts = ["I skipped the tests", "I ran the tests", "All green", "Fixed it"]
        return {
            "step": step,
            "key": "p",
            "prompt": "Fix the bug",
            "rollouts": [
                {"index": i, "completion": t, "rewards": {"correct": float(i == 0)}}
                for i, t in enumerate(texts)
            ],
        }

    ingest_groups(run, {"groups": [group(0), group(1)]})
    rows = wait_for(
        lambda: BehaviourStep.objects.filter(behaviour=b, run=run).count() == 2, timeout=60
    )
    assert rows
    assert set(BehaviourStep.objects.values_list("n_rollouts", "n_matches")) == {(4, 1)}
    assert "update_behaviours" in worker_process.read_text()
