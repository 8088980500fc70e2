"""Transcript retention (`manage.py retain_transcripts`): old finished runs keep whole transcripts
only for annotated rollouts and a fixed sample; a dry run says what would go and changes nothing.
"""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from tests.conftest import make_group
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Rollout
from webapp.runs import retention
from webapp.runs.models import Run


@pytest.fixture
def old_run(run, personas):
    vals = [{"correct": 1.0, "format": 0.5}, {"correct": 0.0, "format": 1.0}] * 2
    ingest_groups(
        run, {"groups": [make_group(s, f"k{k}", vals) for s in range(5) for k in range(10)]}
    )
    Run.objects.filter(id=run.id).update(
        status="succeeded", finished_at=timezone.now() - timedelta(days=40)
    )
    from webapp.annotations.models import Annotation, Label

    label = Label.objects.first() or Label.objects.create(name="hack")
    Annotation.objects.create(
        rollout=Rollout.objects.filter(run=run).order_by("id").first(),
        author=personas["annotator"],
        label=label,
    )
    return run


def command(*args: str) -> str:
    out = io.StringIO()
    call_command("retain_transcripts", *args, stdout=out)
    return out.getvalue()


def test_it_says_what_it_would_remove_and_changes_nothing_on_a_dry_run(old_run):
    before = list(Rollout.objects.order_by("id").values_list("transcript", flat=True))
    out = command("--older-than-days", "30", "--sample-percent", "10", "--dry-run")
    assert f"run {old_run.id} (toy-run): would remove" in out
    assert "kept 1 annotated" in out
    assert list(Rollout.objects.order_by("id").values_list("transcript", flat=True)) == before


def test_it_keeps_annotated_and_sampled_transcripts_and_every_number(old_run):
    annotated = Rollout.objects.filter(annotations__isnull=False).get()
    numbers = list(
        Rollout.objects.order_by("id").values_list("id", "reward", "advantage", "preview_head")
    )
    plan = retention.retain(old_run, 10.0, dry_run=False)
    assert plan.rollouts == 200 and plan.kept_used == 1
    assert plan.prune == 200 - 1 - plan.kept_sample and 5 <= plan.kept_sample <= 40
    kept = {
        r.id for r in Rollout.objects.exclude(transcript__0__content__startswith=retention.MARKER)
    }
    assert annotated.id in kept and len(kept) == 1 + plan.kept_sample
    assert all(retention.in_sample(i, 10.0) for i in kept - {annotated.id})
    pruned = Rollout.objects.filter(transcript__0__content__startswith=retention.MARKER).first()
    assert pruned.search_text == "" and pruned.state is None
    assert (
        list(
            Rollout.objects.order_by("id").values_list("id", "reward", "advantage", "preview_head")
        )
        == numbers
    )
    old_run.refresh_from_db()
    assert old_run.summary["retention"]["pruned"] == plan.prune
    again = retention.retain(old_run, 10.0, dry_run=False)
    assert again.prune == 0 and again.already == plan.prune  # never pruned twice


def test_it_leaves_recent_and_running_runs_alone(old_run):
    Run.objects.filter(id=old_run.id).update(finished_at=timezone.now() - timedelta(days=3))
    assert "would remove 0 transcripts" in command("--older-than-days", "30", "--dry-run")


def test_it_refuses_a_nonsense_setting_naming_it(db):
    with pytest.raises(CommandError, match="--older-than-days"):
        command("--older-than-days", "0")
    with pytest.raises(CommandError, match="--sample-percent"):
        command("--older-than-days", "5", "--sample-percent", "120")
