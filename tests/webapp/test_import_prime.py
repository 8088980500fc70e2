"""`manage.py import_rollouts --format prime-rl` on a default PRIME-RL run written as its
orchestrator writes it: the stored groups are the ones PRIME-RL sampled, with its steps, rewards
and advantages, and the zero-std fraction it saw."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.training.prime_fixtures import default_run
from tests.training.test_importers_prime import (
    A_IDS,
    A_MASK,
    A_SAMPLER,
    A_TURN,
    copy_steps,
    edit_episode,
    trained_step,
)
from tests.webapp.test_import_command import run_import
from training.importers.episodes import TOKENS_DROPPED
from webapp.rollouts.models import Group, Rollout
from webapp.runs.models import Run
from webapp.tokens.models import RolloutTokens, TokenStepStat

pytestmark = pytest.mark.django_db


def stored(run_name: str) -> dict[str, Group]:
    return {g.key: g for g in Group.objects.filter(run__name=run_name, split="train")}


@pytest.mark.parametrize("batch", ["200", "1"])
def test_it_stores_a_default_prime_rl_run_as_prime_rl_trained_it(tmp_path, batch):
    prime = default_run(tmp_path)
    out, err = run_import(tmp_path, "prime-rl", "--batch-groups", batch, run="p")
    assert err == "" and "imported 10 groups, 38 rollouts (0 skipped records)" in out
    assert "not known from the files" not in out
    groups = stored("p")
    assert len(groups) == len(prime.truth) == 9
    for gid, facts in prime.truth.items():
        g = groups[f"g-{gid}"]
        assert (g.size, g.step) == (4, trained_step(facts)), facts["name"]
        rollouts = Rollout.objects.filter(group=g).order_by("index")
        assert [r.reward for r in rollouts] == pytest.approx(facts["rewards"], abs=1e-6)
        assert [r.advantage for r in rollouts] == pytest.approx(facts["advantages"], abs=1e-6)
        scored = [r for r in facts["rewards"] if r is not None]
        assert g.reward_std == pytest.approx(np.std(scored, ddof=1), abs=1e-6), facts["name"]
        assert g.zero_std == (max(scored) == min(scored))
    assert sum(g.zero_std for g in groups.values()) / len(groups) == pytest.approx(1 / 9)
    run = Run.objects.get(name="p")
    assert run.reward_settings["group_size"] == 4 and run.reward_settings["scale_rewards"] == "none"
    assert run.summary["import"]["counts"]["groups trained across two or more steps"] == 1


def test_it_imports_with_on_error_skip_without_dropping_a_split_group(tmp_path):
    prime = default_run(tmp_path)
    out, _ = run_import(tmp_path, "prime-rl", "--on-error", "skip", "--batch-groups", "2", run="s")
    f = next(gid for gid, facts in prime.truth.items() if facts["name"] == "F")
    g = Group.objects.get(run__name="s", key=f"g-{f}")
    assert (g.step, g.size) == (3, 4) and "0 skipped records" in out


def test_it_reports_the_partial_group_of_a_later_half_instead_of_storing_it(tmp_path):
    prime = default_run(tmp_path / "full")
    copy_steps(tmp_path / "full", tmp_path / "early", [1, 2, 3])
    copy_steps(tmp_path / "full", tmp_path / "later", [4])
    run_import(tmp_path / "early", "prime-rl", run="halves")
    out, _ = run_import(tmp_path / "later", "prime-rl", run="halves")
    assert "1 groups (2 episodes) not stored: fewer episodes than the group size" in out
    run = Run.objects.get(name="halves")
    assert any("not stored" in gap for gap in run.summary["import"]["gaps"])
    sizes = Group.objects.filter(run=run, split="train").values_list("size", flat=True)
    assert set(sizes) == {4} and len(sizes) == len(prime.truth)  # no group of 1 or 2


def test_it_stores_the_token_arrays_prime_rl_wrote_with_their_per_step_stats(tmp_path):
    prime = default_run(tmp_path)
    edit_episode(tmp_path, "all", "ep-A-3", lambda n: n[2]["logprobs"].__setitem__(0, math.nan))
    out, err = run_import(tmp_path, "prime-rl", run="tok")
    assert err == "" and "imported 10 groups, 38 rollouts" in out
    run = Run.objects.get(name="tok")
    a = next(gid for gid, f in prime.truth.items() if f["name"] == "A")
    rollouts = list(Rollout.objects.filter(group__run=run, group__key=f"g-{a}").order_by("index"))
    for r, adv in zip(rollouts[:3], (0.5, -0.5, None), strict=True):
        t = RolloutTokens.objects.get(rollout=r).arrays()
        assert t.ids.tolist() == A_IDS and t.turn.tolist() == A_TURN
        assert t.loss_mask.astype(int).tolist() == A_MASK
        assert t.sampler_logprobs == pytest.approx(A_SAMPLER, rel=2e-3, abs=1e-6)  # float16, 8 bits
        assert t.trainer_logprobs is None and t.entropy is None and t.ref_logprobs is None
        if adv is None:
            assert t.advantages is None
        else:
            assert t.advantages == pytest.approx([adv * m for m in A_MASK], rel=2e-3)
    assert not RolloutTokens.objects.filter(rollout=rollouts[3]).exists()  # its NaN: no tokens
    assert rollouts[3].reward == pytest.approx(0.5)
    assert rollouts[3].state["tokens_not_stored"].startswith("nodes[2].logprobs[0]: nan")
    assert run.summary["import"]["counts"][TOKENS_DROPPED] == 1
    with_tokens = RolloutTokens.objects.filter(run=run)
    assert with_tokens.count() == 38 - 1 - 1  # E's trace-less episode and A's NaN one
    stat = TokenStepStat.objects.get(run=run, step=1)  # A and Z: trained or dropped at step 1
    step1 = with_tokens.filter(step=1)
    assert stat.n_rollouts == step1.count() == 7 and stat.n_tokens == 7 * len(A_IDS)
    assert stat.masked_fraction == pytest.approx(A_MASK.count(0) / len(A_MASK))
    assert stat.n_tool_unmasked == 0 and stat.mean_abs_delta is None  # no trainer log-probs
    assert set(with_tokens.values_list("tool_unmasked", flat=True)) == {0}
