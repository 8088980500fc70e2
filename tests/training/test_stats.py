"""training/stats.py against hand-computed cases and against TRL's own nanstd."""

import math

import numpy as np
import pytest

from training import stats

NAN = float("nan")


def test_it_normalises_inside_each_group_with_bessel_std() -> None:
    # Group 0: rewards 1, 0 -> mean 0.5, std (Bessel) = sqrt(0.5) = 0.70711; A = ±0.5 /
    # (0.70711 + 1e-4)
    r = stats.compute_advantages(np.array([[1.0], [0.0], [3.0], [3.0]]), [1.0], group_size=2)
    expected = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert r.advantages[:2] == pytest.approx([expected, -expected], abs=1e-12)
    # Group 1 is all-equal: advantage 0 and flagged zero-std.
    assert r.advantages[2:].tolist() == [0.0, 0.0]
    assert r.is_std_zero.tolist() == [False, False, True, True]
    assert r.group_std[0] == pytest.approx(math.sqrt(0.5))


def test_it_sums_weighted_components_before_normalising() -> None:
    rpf = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    r = stats.compute_advantages(rpf, [2.0, 0.5], group_size=3)
    # rewards 2.0, 0.5, 2.5; mean 5/3; std = sqrt(((1/3)^2 + (7/6)^2 + (5/6)^2)/2)
    assert r.rewards.tolist() == [2.0, 0.5, 2.5]
    std = math.sqrt(((2 - 5 / 3) ** 2 + (0.5 - 5 / 3) ** 2 + (2.5 - 5 / 3) ** 2) / 2)
    assert r.advantages == pytest.approx([(x - 5 / 3) / (std + 1e-4) for x in (2.0, 0.5, 2.5)])


def test_it_leaves_advantages_unscaled_with_scale_rewards_none() -> None:
    r = stats.compute_advantages(
        np.array([[1.0], [0.0]]), [1.0], group_size=2, scale_rewards="none"
    )
    assert r.advantages.tolist() == [0.5, -0.5]


def test_it_uses_the_batch_std_with_scale_rewards_batch() -> None:
    rpf = np.array([[1.0], [0.0], [2.0], [2.0]])
    r = stats.compute_advantages(rpf, [1.0], group_size=2, scale_rewards="batch")
    batch_std = np.std([1.0, 0.0, 2.0, 2.0], ddof=1)
    assert r.advantages == pytest.approx(
        [0.5 / (batch_std + 1e-4), -0.5 / (batch_std + 1e-4), 0.0, 0.0]
    )
    # batch_ids split the rows into two steps: each uses its own batch std.
    r2 = stats.compute_advantages(
        rpf, [1.0], group_size=2, scale_rewards="batch", batch_ids=np.array([0, 0, 1, 1])
    )
    assert r2.advantages[0] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-4))
    assert r2.advantages[2:].tolist() == [0.0, 0.0]


def test_it_gives_a_single_completion_group_zero_advantage() -> None:
    r = stats.compute_advantages(np.array([[0.7]]), [1.0], group_size=1)
    assert r.advantages.tolist() == [0.0]
    assert r.is_std_zero.tolist() == [True]


def test_it_treats_a_fully_unscorable_completion_as_nan_reward_and_zero_advantage() -> None:
    rpf = np.array([[1.0, NAN], [NAN, NAN], [0.0, NAN]])
    r = stats.compute_advantages(rpf, [1.0, 1.0], group_size=3)
    assert math.isnan(r.rewards[1])
    assert r.advantages[1] == 0.0
    # The baseline ignores the unscorable row: mean of (1, 0) = 0.5, std sqrt(0.5).
    assert r.advantages[0] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-4))


def test_it_counts_a_component_missing_for_some_rollouts_as_zero_in_the_sum() -> None:
    # nansum: a component that returned None for one completion contributes nothing to its reward.
    rpf = np.array([[1.0, 0.5], [1.0, NAN]])
    r = stats.compute_advantages(rpf, [1.0, 1.0], group_size=2)
    assert r.rewards.tolist() == [1.5, 1.0]
    cs = stats.group_stats(rpf, np.array([0, 0]))
    assert cs.count.tolist() == [[2.0, 1.0]]
    assert math.isnan(cs.std[0, 1])  # one value: no std, as torch's nanstd


def test_it_normalises_each_component_first_with_normalize_then_sum() -> None:
    rpf = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    r = stats.compute_advantages(rpf, [1.0, 1.0], group_size=2, aggregation="normalize_then_sum")
    s = math.sqrt(0.5)
    # Group 0: component 0 -> ±0.5/(s+eps), component 1 constant -> 0. Group 1: c0 const, c1 ±.
    per = [0.5 / (s + 1e-4), -0.5 / (s + 1e-4), 0.5 / (s + 1e-4), -0.5 / (s + 1e-4)]
    bstd = np.std(per, ddof=1)
    assert r.rewards == pytest.approx(per)
    assert r.advantages == pytest.approx([(x - np.mean(per)) / (bstd + 1e-4) for x in per])


def test_it_handles_unordered_group_ids_and_unequal_group_sizes() -> None:
    rpf = np.array([[0.0], [5.0], [1.0], [5.0], [2.0]])
    ids = np.array([10, 99, 10, 99, 10])
    r = stats.compute_advantages(rpf, [1.0], ids)
    assert r.advantages[1] == 0.0 and r.advantages[3] == 0.0
    assert r.advantages[0] == pytest.approx(-1.0 / (1.0 + 1e-4))
    assert r.advantages[4] == pytest.approx(1.0 / (1.0 + 1e-4))


def test_it_matches_trl_nanstd_on_random_groups() -> None:
    torch = pytest.importorskip("torch")
    from trl.trainer.utils import nanstd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8))
    x[rng.random(x.shape) < 0.1] = np.nan
    ours = stats.group_stats(x.ravel(), np.repeat(np.arange(64), 8)).std
    theirs = nanstd(torch.tensor(x), dim=1).numpy()
    assert np.allclose(ours, theirs, equal_nan=True)


def test_it_reports_the_fraction_of_zero_std_groups_per_component() -> None:
    rpf = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    frac = stats.zero_std_fraction(rpf, np.array([0, 0, 1, 1]))
    assert frac.tolist() == [1.0, 0.5]
    assert stats.zero_std_fraction(np.array([1.0, 2.0, 3.0, 3.0]), np.array([0, 0, 1, 1])) == 0.5


def test_it_ranks_values_within_groups() -> None:
    ranks = stats.rank_within_groups(np.array([3.0, 1.0, 2.0, 9.0, NAN]), np.array([0, 0, 0, 1, 1]))
    assert ranks.tolist() == [2, 0, 1, 1, 0]


def test_it_rejects_mismatched_weights() -> None:
    with pytest.raises(ValueError, match="weights"):
        stats.compute_advantages(np.zeros((2, 2)), [1.0], group_size=2)
