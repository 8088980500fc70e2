"""Reward replay: creating, scoring in chunks, failing closed, summarising (in-process; the real
worker is in test_replay_worker.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.webapp import replay_fixtures as fx
from training import reward_versions as rv
from webapp.errors import FieldError

STRICT = [{"version": "semantic_coverage@strict"}]
STRICT_GROUP = [fx.FULL, fx.MISSING_EDGE, fx.MISSING_NODE, fx.EXTRA_NODE, fx.PROSE, fx.EDGE_SPAM]


@pytest.fixture
def drun(personas):
    run = fx.diagram_run(personas["trainer"])
    fx.ingest(
        run,
        [
            fx.group_record(step, f"g{step}-{k}", STRICT_GROUP)
            for step in range(3)
            for k in range(2)
        ],
    )
    return run


def _replay(run, versions=STRICT, selection=None, **kw):
    from webapp.replays import services
    from webapp.replays.models import Replay

    replay = services.create_replay(
        run, {"versions": versions, "selection": selection or {"mode": "all"}, **kw}
    )
    services.work(replay.id, "test-worker")
    return Replay.objects.get(id=replay.id)


def _values(replay, component="semantic_coverage"):
    from webapp.replays.models import ReplayScore

    return {
        s.rollout.index: s
        for s in ReplayScore.objects.filter(
            replay=replay, component__name=component
        ).select_related("rollout")
    }


def test_it_changes_exactly_the_rollouts_below_the_stricter_threshold(drun):
    from webapp.rollouts.models import RewardScore

    replay = _replay(drun)
    assert replay.status == "succeeded" and replay.done == replay.total == 36 and replay.failed == 0
    changed = set()
    for s in _values(replay).values():
        original = RewardScore.objects.get(rollout=s.rollout, component=s.component)
        if abs(s.value - original.value) > 1e-12:
            changed.add(s.rollout.index)
            assert s.value == 0.0 and "below the 0.8 threshold" in s.reason
    assert changed == {1, 2}  # MISSING_EDGE 0.75 and MISSING_NODE 0.58; EDGE_SPAM's 0.83 stays
    assert replay.stats["n_changed"] == 12 and "12 changed" in replay.summary
    # The originals are untouched: new values live beside them.
    assert (
        RewardScore.objects.filter(
            run=drun, component__name="semantic_coverage", value=0.75
        ).count()
        == 6
    )


def test_it_recomputes_advantages_with_the_runs_settings(drun):
    from training import stats
    from webapp.replays.services import load_results

    replay = _replay(drun)
    a = load_results(replay)
    weights = np.array([0.2, 0.2, 1.0, 0.3])
    expected = stats.compute_advantages(a["new"], weights, a["group_ids"], batch_ids=a["steps"])
    assert np.allclose(a["new_adv"], expected.advantages)
    assert np.allclose(
        a["new_reward"][a["ids"] == a["ids"][1]], 0.2 + 0.2 + 0.0 + 0.3
    )  # MISSING_EDGE after
    stored = dict(drun.rollouts.values_list("id", "advantage"))
    assert np.allclose(
        a["old_adv"], [stored[i] for i in a["ids"]]
    )  # the original, recomputed, matches ingest


def test_it_replays_a_step_window_and_a_sample(drun):
    window = _replay(drun, selection={"mode": "steps", "step_min": 1, "step_max": 1})
    assert window.total == 12 and set(window.scores.values_list("rollout__step", flat=True)) == {1}
    sample = _replay(drun, selection={"mode": "sample", "groups": 2, "seed": 3})
    assert sample.total == 12 and sample.stats["n_groups"] == 2


@pytest.mark.parametrize(
    "body, field",
    [
        ({"versions": [{"version": "os:system"}]}, "versions[0].version"),
        ({"versions": []}, "versions"),
        ({"versions": STRICT * 2}, "versions[1].version"),
        (
            {"versions": [{"version": "semantic_coverage", "params": {"min_coverage": "high"}}]},
            "versions[0].params.min_coverage",
        ),
        (
            {"versions": [{"version": "semantic_coverage", "params": {"rm_rf": 1}}]},
            "versions[0].params.rm_rf",
        ),
        (
            {"versions": STRICT, "selection": {"mode": "steps", "step_min": 5, "step_max": 1}},
            "selection.step_max",
        ),
        ({"versions": STRICT, "selection": {"mode": "steps", "step_min": 50}}, "selection"),
        ({"versions": STRICT, "selection": {"mode": "sample"}}, "selection.groups"),
        ({"versions": STRICT, "code": "import os"}, "code"),
    ],
)
def test_it_refuses_bad_requests_naming_the_field_and_stores_nothing(drun, body, field):
    from webapp.replays import services
    from webapp.replays.models import Replay, ReplayChunk

    with pytest.raises(FieldError) as e:
        services.create_replay(drun, body)
    assert e.value.field == field
    assert not Replay.objects.exists() and not ReplayChunk.objects.exists()


def flaky_layout(prompt, completion, *, mode="mixed"):
    """A user's component that raises on some rollouts, returns NaN or text on others."""
    text = completion[-1]["content"]
    if "Monitor" in text:
        raise KeyError("Monitor")
    if text.startswith("Sure"):
        return math.nan
    if "Deploy" not in text:
        return "good"
    return 0.5


@pytest.fixture
def flaky_version():
    rv.register(
        "diagram", "layout_quality", f"{__name__}:flaky_layout", name="layout_quality@flaky"
    )
    yield
    rv._REGISTRY.pop(("diagram", "layout_quality@flaky"), None)


def test_it_records_failing_rollouts_with_their_reason_and_never_nan(drun, flaky_version):
    replay = _replay(drun, [{"version": "layout_quality@flaky"}])
    values = _values(replay, "layout_quality")
    assert (
        replay.status == "succeeded" and replay.failed == 18
    )  # per group: EXTRA_NODE, PROSE, MISSING_NODE
    assert "raised KeyError" in values[3].reason and "returned nan" in values[4].reason
    assert "returned str, not a number" in values[2].reason
    assert all(v.value == 0.0 and not v.ok for i, v in values.items() if i in (2, 3, 4))
    assert values[0].ok and values[0].value == 0.5
    assert not any(math.isnan(v) for v in replay.scores.values_list("value", flat=True))
    assert "18 failed" in replay.summary


def test_it_stores_nothing_for_a_chunk_whose_code_changed_on_the_worker(drun, settings):
    from webapp.replays import services
    from webapp.replays.models import Replay

    settings.REPLAY_CHUNK_ROLLOUTS = 12
    replay = services.create_replay(drun, {"versions": STRICT})
    Replay.objects.filter(id=replay.id).update(
        versions=[{**replay.versions[0], "source_hash": "0" * 16}]
    )
    services.work(replay.id, "w")
    replay.refresh_from_db()
    assert (
        replay.status == "failed"
        and replay.n_chunks == 3
        and "changed since the replay was created" in replay.error
    )
    assert not replay.scores.exists() and replay.done == 0 and "replayed 0 of 36" in replay.summary


def test_it_covers_only_the_steps_stored_when_a_live_run_was_replayed(personas):
    from webapp.replays import services

    run = fx.diagram_run(personas["trainer"], status="running")
    fx.ingest(run, [fx.group_record(0, "a", STRICT_GROUP)])
    replay = services.create_replay(run, {"versions": STRICT})
    fx.ingest(run, [fx.group_record(1, "b", STRICT_GROUP)])  # the trainer goes on writing
    services.work(replay.id, "w")
    replay.refresh_from_db()
    assert replay.run_was_live and replay.total == 6 and replay.stats["n_rollouts"] == 6


def test_it_claims_each_chunk_once(drun, settings):
    from webapp.replays import queue, services

    settings.REPLAY_CHUNK_ROLLOUTS = 6
    replay = services.create_replay(drun, {"versions": STRICT})
    claims = [queue.claim_chunk(replay.id, f"w{i}") for i in range(7)]
    assert [c.index for c in claims[:6]] == list(range(6)) and claims[6] is None
    assert not queue.finish(replay.id)  # chunks still running: nobody summarises yet


def test_it_cancels_between_chunks(drun, settings):
    from webapp.replays import services
    from webapp.replays.models import Replay

    settings.REPLAY_CHUNK_ROLLOUTS = 6
    queued = services.create_replay(drun, {"versions": STRICT})
    queued.request_cancel()
    assert queued.status == "cancelled"
    running = services.create_replay(drun, {"versions": STRICT})
    Replay.objects.filter(id=running.id).update(status="running", cancel_requested=True)
    services.work(running.id, "w")
    running.refresh_from_db()
    assert running.status == "cancelled" and running.summary == "cancelled after 0 of 36 rollouts"
    assert not running.scores.exists()


def test_it_counts_regressions_of_annotated_hacks(personas):
    from webapp.replays import analysis

    run = fx.diagram_run(personas["trainer"])
    fx.ingest(
        run,
        [
            fx.group_record(0, "spam", [fx.EDGE_SPAM, fx.MISSING_EDGE, fx.MISSING_NODE, fx.PROSE]),
            fx.group_record(0, "stack", [fx.STACKED, fx.MISSING_EDGE, fx.MISSING_NODE, fx.PROSE]),
        ],
    )
    spam = run.rollouts.get(group__key="spam", index=0)
    stacked = run.rollouts.get(group__key="stack", index=0)
    fx.annotate(spam.id, "reward-hacking", personas["annotator"])
    fx.annotate(stacked.id, "reward-hacking", personas["annotator"])
    fx.annotate(
        run.rollouts.get(group__key="spam", index=1).id,
        "false-negative-reward",
        personas["annotator"],
    )
    replay = _replay(run, [{"version": "semantic_coverage@no_extras"}])
    rows = {
        r["rollout_id"]: r
        for r in analysis.compare(
            _arrays(replay),
            ["json_valid", "schema_valid", "semantic_coverage", "layout_quality"],
            replay.components(),
            np.array([0.2, 0.2, 1.0, 0.3]),
            analysis.regression_labels(run.id),
        )["regression"]
    }
    assert (
        rows[spam.id]["rank_before"],
        rows[spam.id]["rank_after"],
        rows[spam.id]["regression"],
    ) == (1, 3, False)
    assert (
        rows[stacked.id]["rank_before"],
        rows[stacked.id]["rank_after"],
        rows[stacked.id]["regression"],
    ) == (2, 2, True)
    assert replay.stats["hacks"] == 2 and replay.stats["hacks_above_median"] == 1
    assert "reward hacks still ranked best in their group: 0 of 2" in replay.summary
    assert len(rows) == 3


def _arrays(replay):
    from webapp.replays.services import load_results

    return load_results(replay)


def test_it_ranks_with_ties_sharing_the_best_rank():
    from webapp.replays.analysis import group_ranks

    ranks = group_ranks(np.array([1.0, 3.0, 3.0, np.nan, 2.0, 0.5]), np.array([0, 0, 0, 0, 1, 1]))
    assert ranks.tolist() == [3, 1, 1, 4, 1, 2]


def test_it_reclaims_a_stale_chunk_and_ignores_the_late_result(drun, settings):
    from datetime import timedelta

    from django.utils import timezone

    from webapp.replays import queue, services
    from webapp.replays.models import ReplayChunk

    settings.REPLAY_CHUNK_ROLLOUTS = 36
    replay = services.create_replay(drun, {"versions": STRICT})
    dead = queue.claim_chunk(replay.id, "worker-that-died")
    assert queue.claim_chunk(replay.id, "w2") is None  # fresh claims are respected
    ReplayChunk.objects.filter(id=dead.id).update(claimed_at=timezone.now() - timedelta(hours=1))
    again = queue.claim_chunk(replay.id, "w2")
    assert again.id == dead.id and again.worker == "w2"
    queue.process_chunk(replay, again, None)
    queue.process_chunk(
        replay, dead, None
    )  # the first worker comes back late: nothing is stored twice
    replay.refresh_from_db()
    assert replay.done == 36 and replay.scores.count() == 36


def test_it_resummarises_a_replay_whose_summarising_worker_died(drun, client_as, monkeypatch):
    """A worker killed while summarising leaves the replay 'summarising'; after the stale
    limit the page offers Resume (trainers only), which queues the task again, and the next
    worker summarises it."""
    from datetime import timedelta

    from django.urls import reverse
    from django.utils import timezone

    from webapp.replays import queue, results, services
    from webapp.replays.models import Replay

    replay = services.create_replay(drun, {"versions": STRICT})

    def killed(replay):
        raise SystemExit(
            "worker killed mid-summary"
        )  # not an Exception: finish() cannot record a failure

    monkeypatch.setattr(results, "summarise", killed)
    with pytest.raises(SystemExit):
        services.work(replay.id, "doomed")
    monkeypatch.undo()
    replay.refresh_from_db()
    assert replay.status == "summarising" and replay.results is None and replay.done == replay.total
    assert not queue.finish(replay.id) and not queue.stalled(
        replay
    )  # a live summariser is left alone
    page = reverse("replays-detail", args=[replay.id])
    assert 'id="replay-resume"' not in client_as("trainer").get(page).content.decode()

    Replay.objects.filter(id=replay.id).update(summarising_at=timezone.now() - timedelta(hours=1))
    replay.refresh_from_db()
    assert queue.stalled(replay)
    assert 'id="replay-resume"' not in client_as("viewer").get(page).content.decode()
    assert client_as("viewer").post(reverse("replays-resume", args=[replay.id])).status_code == 403
    assert 'id="replay-resume"' in client_as("trainer").get(page).content.decode()
    queued = []
    monkeypatch.setattr(queue, "enqueue", queued.append)
    assert client_as("trainer").post(reverse("replays-resume", args=[replay.id])).status_code == 302
    assert [r.id for r in queued] == [replay.id]
    assert (
        queue.resume_stalled() == 0 and len(queued) == 1
    )  # re-queued once per stale limit, not per beat
    services.work(replay.id, "next-worker")  # what the queued task runs
    replay.refresh_from_db()
    assert (
        replay.status == "succeeded" and replay.results is not None and "rollouts" in replay.summary
    )


def test_it_resumes_a_running_replay_only_when_its_chunk_went_stale(drun, settings):
    from datetime import timedelta

    from django.utils import timezone

    from webapp.replays import queue, services
    from webapp.replays.models import Replay, ReplayChunk

    settings.REPLAY_CHUNK_ROLLOUTS = 36
    replay = services.create_replay(drun, {"versions": STRICT})
    hour_ago = timezone.now() - timedelta(hours=1)
    Replay.objects.filter(id=replay.id).update(status="running", started_at=hour_ago)
    chunk = queue.claim_chunk(replay.id, "worker-that-dies")
    replay.refresh_from_db()
    assert not queue.stalled(replay) and not queue.resume(
        replay
    )  # its worker is still within the limit
    ReplayChunk.objects.filter(id=chunk.id).update(claimed_at=hour_ago)
    assert queue.stalled(replay)
    services.work(replay.id, "w2")
    replay.refresh_from_db()
    assert (
        replay.status == "succeeded" and replay.done == replay.total and not queue.stalled(replay)
    )


def test_it_requeues_each_stalled_replay_once_from_the_worker_heartbeat(drun, monkeypatch):
    """What every worker's heartbeat runs (workers/tasks.py _beat): only stalled replays, one task
    each however many workers beat, again after another stale limit if that task was lost too."""
    from datetime import timedelta

    from django.utils import timezone

    from webapp.replays import queue, services
    from webapp.replays.models import Replay

    hour_ago = timezone.now() - timedelta(hours=1)
    dead = services.create_replay(drun, {"versions": STRICT})
    Replay.objects.filter(id=dead.id).update(status="summarising", summarising_at=hour_ago)
    busy = services.create_replay(drun, {"versions": STRICT})
    Replay.objects.filter(id=busy.id).update(status="summarising", summarising_at=timezone.now())
    queued = []
    monkeypatch.setattr(queue, "enqueue", lambda r: queued.append(r.id))
    assert queue.resume_stalled() == 1 and queue.resume_stalled() == 0  # two workers' beats
    assert queued == [dead.id]
    Replay.objects.filter(id=dead.id).update(resumed_at=hour_ago)  # that task was lost as well
    assert queue.resume_stalled() == 1 and queued == [dead.id, dead.id]
