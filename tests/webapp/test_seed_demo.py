"""`manage.py seed_demo` (what `make demo` seeds): the failure stories exist and are flagged
correctly on first open, the ablations tell dead from live, the annotation pages have data, and a
re-run neither fails nor duplicates. The ask_to_code episodes run their code in the real sandbox
(training.sandbox)."""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command

from training.demo_stories import BROKEN_REASON
from webapp.annotations.models import Annotation, Dataset, ReviewQueue
from webapp.annotations.services import queue_agreement
from webapp.diagnostics.models import Ablation
from webapp.diagnostics.report import run_report
from webapp.replays.models import Replay
from webapp.rollouts.models import Group, RewardScore
from webapp.runs.management.commands import seed_demo
from webapp.runs.models import Run

pytestmark = (
    pytest.mark.slow
)  # one seeding for the module: ~15 s on a loaded 2-core box (sandboxed episodes)


@pytest.fixture(scope="module")
def seeded(django_db_setup, django_db_blocker):
    """Seed once for the module (a small diagram run; the stories at their demo size), timed, inside
    one transaction that is rolled back afterwards: the next modules find the database as it was
    (each test here runs in a savepoint of it)."""
    from django.core.cache import cache
    from django.db import transaction

    with django_db_blocker.unblock(), transaction.atomic():
        t0 = time.perf_counter()
        out = io.StringIO()
        call_command("seed_demo", steps=2, groups_per_step=2, G=4, stdout=out)
        yield {"seconds": time.perf_counter() - t0, "out": out.getvalue()}
        transaction.set_rollback(True)
    cache.clear()


@pytest.fixture
def db_access(seeded, db):
    return seeded


def finding(doc: dict, code: str, component: str | None = None) -> dict | None:
    return next(
        (
            f
            for f in doc["findings"]
            if f["code"] == code and (component is None or f["component"] == component)
        ),
        None,
    )


def test_it_flags_the_broken_verifier_run_on_first_open(db_access):
    broken = Run.objects.get(name=seed_demo.BROKEN_RUN)
    doc = run_report(broken, None)
    dead = finding(doc, "dead_component", "correctness")
    assert (
        doc["status"] == "critical" and dead["severity"] == "critical" and dead["onset_step"] == 0
    )
    assert "verifier actually runs" in dead["fix"]
    sat = finding(doc, "saturation", "asked_before_coding")
    assert sat["onset_step"] == seed_demo.STORY["saturate_at"] and "stays flat" in sat["title"]
    reasons = set(
        RewardScore.objects.filter(run=broken, component__name="correctness").values_list(
            "reason", flat=True
        )
    )
    assert reasons == {BROKEN_REASON}


def test_it_flags_only_the_saturation_on_the_fixed_twin(db_access):
    fixed = Run.objects.get(name=seed_demo.FIXED_RUN)
    doc = run_report(fixed, None)
    assert doc["status"] == "warning" and not [
        f for f in doc["findings"] if f["severity"] == "critical"
    ]
    sat = finding(doc, "saturation", "asked_before_coding")
    assert sat["onset_step"] == seed_demo.STORY["saturate_at"] and "still varies" in sat["title"]
    assert fixed.parent.name == seed_demo.BROKEN_RUN


def test_it_shows_no_change_when_dropping_the_dead_component_and_a_large_one_when_it_works(
    db_access,
):
    broken = Ablation.objects.get(
        run__name=seed_demo.BROKEN_RUN, name=seed_demo.ABLATION_NAME
    ).results
    fixed = Ablation.objects.get(
        run__name=seed_demo.FIXED_RUN, name=seed_demo.ABLATION_NAME
    ).results
    assert broken["mean_abs_delta"] < 1e-9 and broken["sign_flip_frac"] == 0
    assert (
        broken["verdict"]["level"] == "no_signal"
        and "changes (almost) nothing" in broken["verdict"]["text"]
    )
    assert fixed["verdict"]["level"] == "strong" and fixed["best_changed_frac"] > 0.2, fixed[
        "verdict"
    ]


def test_it_seeds_an_annotator_a_queue_both_annotated_and_a_dpo_dataset(db_access):
    queue = ReviewQueue.objects.get(name=seed_demo.QUEUE_NAME)
    authors = set(
        Annotation.objects.filter(rollout__queue_items__queue=queue).values_list(
            "author__username", flat=True
        )
    )
    assert authors == {seed_demo.DEMO_USER, seed_demo.ANNOTATOR}
    result = queue_agreement(queue)["result"]
    assert (
        result.items == queue.items.count()
        and result.disagreements
        and len(result.disagreements) < result.items
    )
    assert result.alpha is not None and 0 < result.alpha < 1
    dataset = Dataset.objects.get(name=seed_demo.DATASET_NAME)
    assert dataset.kind == "dpo" and dataset.records.count() > 0


def test_it_replays_the_diagram_run_against_the_hacks_the_annotator_labelled(db_access):
    """The replay loop on demo data: extra-shape winners labelled as reward hacks, a replay with the
    stricter registered version, and a regression table that follows exactly those rollouts."""
    from webapp.replays import services as replays

    run = Run.objects.get(name=seed_demo.RUN_NAME)
    hacks = set(
        Annotation.objects.filter(rollout__run=run, label__slug="reward-hacking").values_list(
            "rollout_id", flat=True
        )
    )
    assert hacks, "the seeded diagram run has no extra-shape winner to label"
    for rid in hacks:
        score = RewardScore.objects.get(rollout_id=rid, component__name="semantic_coverage")
        assert "extra" in score.reason
    replay = Replay.objects.get(run=run, name=seed_demo.REPLAY_NAME)
    assert replay.status == Replay.Status.SUCCEEDED and replay.done == replay.total > 0
    assert replay.versions[0]["name"] == seed_demo.REPLAY_VERSION
    regression = replays.regress(replay)
    assert {row["rollout_id"] for row in regression.rows} == hacks
    assert all(row["rank_before"] == 1 for row in regression.rows)
    # extras now cost more: no labelled hack keeps a reward as high as before
    assert all(row["reward_after"] < row["reward_before"] for row in regression.rows)
    assert f"/replays/{replay.id}/" in db_access["out"]


def test_it_neither_fails_nor_duplicates_when_run_again(db_access):
    def counts():
        return (
            Run.objects.count(),
            Group.objects.count(),
            Annotation.objects.count(),  # noqa: E731
            Ablation.objects.count(),
            Dataset.objects.count(),
            ReviewQueue.objects.count(),
            Replay.objects.count(),
        )

    before = counts()
    t0 = time.perf_counter()
    call_command("seed_demo", steps=2, groups_per_step=2, G=4, stdout=io.StringIO())
    assert counts() == before
    assert time.perf_counter() - t0 < db_access["seconds"]  # nothing is generated again


def test_the_token_story_flags_its_planted_mismatch_at_its_step(db_access):
    from webapp.tokens.models import RolloutTokens

    drift = Run.objects.get(name=seed_demo.DRIFT_RUN)
    n = Group.objects.filter(run=drift).count() * seed_demo.STORY["G"]
    assert RolloutTokens.objects.filter(run=drift).count() == n  # every rollout has tokens
    doc = run_report(drift, None)
    f = finding(doc, "token_mismatch")
    assert f is not None and f["onset_step"] == seed_demo.DRIFT_STEP
    assert not finding(doc, "entropy_collapse") and not finding(doc, "tool_tokens_in_loss")
    assert f"token story run {drift.id}" in db_access["out"]
