"""A real Celery worker process, on the configured broker, executes tasks against
the test database."""

import pytest

from tests.conftest import make_group, wait_for


@pytest.mark.slow
@pytest.mark.broker
def test_it_recomputes_run_stats_in_a_real_worker(worker_process, run):
    from webapp.rollouts.ingest import ingest_groups
    from webapp.rollouts.models import GroupComponentStat
    from workers.tasks import recompute_run_stats

    ingest_groups(run, {"groups": [make_group(0, "p", [{"correct": 1.0}, {"correct": 0.0}])]})
    GroupComponentStat.objects.all().delete()  # the task must rebuild what ingestion stored
    recompute_run_stats.delay(run.id)
    stat = wait_for(lambda: GroupComponentStat.objects.filter(run=run).first(), timeout=60)
    assert stat.component.name == "correct" and stat.std == pytest.approx(0.7071, abs=1e-3)
    assert "recomputed 1 groups" in wait_for(
        lambda: "recomputed" in worker_process.read_text() and worker_process.read_text()
    )
