"""`manage.py import_rollouts --format verifiers|art` into the database."""

from __future__ import annotations

import pytest

from tests.training.test_importers_art import art_advantages, write_v2
from tests.training.test_importers_verifiers import WEIGHTS, write_results
from tests.webapp.test_import_command import run_import
from webapp.rollouts.models import Group, Rollout
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db


def test_it_imports_prime_eval_results_with_the_rubric_weights(tmp_path):
    write_results(tmp_path / "tool-search--qwen3")
    out, err = run_import(tmp_path, "verifiers", run="ev")
    assert err == "" and "imported 2 groups, 6 rollouts (0 skipped records)" in out
    run = Run.objects.get(name="ev")
    assert run.reward_settings["weights"] == pytest.approx(WEIGHTS)
    assert run.reward_settings["group_size"] == 3
    g = Group.objects.get(run=run, key="tool-search--qwen3:ex-0")
    assert g.split == "holdout" and g.size == 3
    r = Rollout.objects.get(group=g, index=2)
    assert r.truncated and r.reward == pytest.approx(0.0 + 0.2 * 1.0 + 0.0)


def test_it_imports_art_trajectory_groups(tmp_path):
    write_v2(tmp_path / "trajectories" / "train" / "0002.parquet", [[1.0, 0.0, 0.5]])
    out, _ = run_import(tmp_path, "art", run="art")
    assert "imported 1 groups, 3 rollouts" in out and "not known from the files" in out
    g = Group.objects.get(run__name="art")
    assert g.step == 2 and g.size == 3
    advantages = list(g.rollouts.order_by("index").values_list("advantage", flat=True))
    assert advantages == pytest.approx(art_advantages([1.0, 0.0, 0.5]))
    assert "gaps" in Run.objects.get(name="art").summary["import"]
