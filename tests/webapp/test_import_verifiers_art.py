"""`manage.py import_rollouts --format verifiers|art` into the database."""

from __future__ import annotations

import pytest

from tests.training.test_importers_art import art_advantages, write_v2
from tests.training.test_importers_verifiers import (
    V_IDS,
    V_MASK,
    V_TURN,
    WEIGHTS,
    spread,
    token_episodes,
    write_results,
    write_v1,
)
from tests.webapp.test_import_command import run_import
from webapp.rollouts.models import Group, Rollout
from webapp.runs.models import Run
from webapp.tokens.models import RolloutTokens, TokenStepStat

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


def test_it_stores_the_token_arrays_of_v1_eval_traces(tmp_path):
    write_v1(tmp_path / "calc-env--m--abc", token_episodes())
    out, err = run_import(tmp_path, "verifiers", run="vtok")
    assert err == "" and "imported 2 groups, 4 rollouts" in out
    run = Run.objects.get(name="vtok")
    r = Rollout.objects.get(group__run=run, group__key="calc-env--m--abc:t-k0", index=0)
    t = RolloutTokens.objects.get(rollout=r).arrays()
    assert t.ids.tolist() == V_IDS and t.turn.tolist() == V_TURN
    assert t.loss_mask.astype(int).tolist() == V_MASK
    sampler = spread([-0.03125 * (k + 1) for k in range(7)])
    trainer = spread([-0.015625 * (k + 1) for k in range(7)])
    assert t.sampler_logprobs == pytest.approx(sampler, rel=2e-3, abs=1e-6)  # float16, 8 bits
    assert t.trainer_logprobs == pytest.approx(trainer, rel=2e-3, abs=1e-6)
    assert t.ref_logprobs == pytest.approx(spread([-0.5 - 0.0625 * k for k in range(7)]), rel=2e-3)
    assert t.entropy == pytest.approx(spread([0.125 * (k + 1) for k in range(7)]), rel=2e-3)
    assert t.advantages is None
    stat = TokenStepStat.objects.get(run=run, step=0)  # an evaluation: the holdout at step 0
    assert stat.n_rollouts == 4 and stat.n_tokens == 4 * len(V_IDS) and stat.n_pairs == 11
    counted = [i for i, m in enumerate(V_MASK) if m]  # the statistics count the trained tokens
    deltas = [abs(trainer[i] - sampler[i]) for i in counted]
    assert stat.mean_abs_delta == pytest.approx(sum(deltas) / len(deltas), rel=1e-6)
    assert stat.masked_fraction == pytest.approx(V_MASK.count(0) / len(V_MASK))
    assert RolloutTokens.objects.get(rollout=r).mismatch == pytest.approx(stat.mean_abs_delta)
