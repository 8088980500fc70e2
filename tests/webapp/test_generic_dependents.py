"""The reaper and retention find dependent tables from the model graph: an app added later with a
per-rollout table (here a stand-in for webapp/tokens: one row per rollout, one-to-one) is deleted
with its run and pruned with its transcript, with no change to either."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection, models

from tests.conftest import make_group
from webapp.rollouts.ingest import ingest_groups


@pytest.fixture
def token_layer(transactional_db):
    """A model one-to-one with Rollout and its table, removed again after the test."""

    class TokenLayer(models.Model):
        rollout = models.OneToOneField(
            "rollouts.Rollout", on_delete=models.CASCADE, related_name="token_layer_test"
        )
        ids = models.BinaryField()

        class Meta:
            app_label = "rollouts"

    with connection.schema_editor() as editor:
        editor.create_model(TokenLayer)
    try:
        yield TokenLayer
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(TokenLayer)
        del apps.all_models["rollouts"]["tokenlayer"]
        apps.clear_cache()


def stored(run, model) -> None:
    from webapp.rollouts.models import Rollout

    vals = [{"correct": 1.0}, {"correct": 0.0}] * 4
    ingest_groups(
        run, {"groups": [make_group(s, f"k{k}", vals) for s in range(3) for k in range(4)]}
    )
    model.objects.bulk_create(
        model(rollout_id=rid, ids=b"\x01\x02")
        for rid in Rollout.objects.filter(run=run).values_list("id", flat=True)
    )


def test_the_reaper_deletes_a_new_apps_per_rollout_rows(token_layer, run):
    from webapp.runs import deletion

    stored(run, token_layer)
    assert token_layer.objects.count() == 96
    run.status = "succeeded"
    run.save(update_fields=["status"])
    deletion.request_delete(run)
    assert deletion.reap(run.id).finished
    assert token_layer.objects.count() == 0


def test_retention_drops_a_new_apps_per_rollout_rows_with_the_transcript(token_layer, run):
    from webapp.runs import retention

    stored(run, token_layer)
    assert token_layer in [m for m, _ in retention.layers()]
    plan = retention.retain(run, 0.0, dry_run=True)
    assert plan.layers["rollouts.TokenLayer"] == 96 and token_layer.objects.count() == 96
    assert set(plan.layers) - {"rollouts.TokenLayer"} <= {"tokens.RolloutTokens"}  # real, empty
    plan = retention.retain(run, 0.0, dry_run=False)
    assert plan.prune == 96 and token_layer.objects.count() == 0
